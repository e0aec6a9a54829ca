"""What runs: arch limits, engines, tiles, shared memory; the plans of each kernel family."""
