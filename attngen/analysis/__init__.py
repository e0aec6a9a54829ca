"""Facts about IR expressions: tile classification over intervals, score derivatives."""
