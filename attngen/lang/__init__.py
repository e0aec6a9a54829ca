"""The language: .attn text -> AST -> semantic IR (parse, lower, builtins), printer, fmt, diagnostics."""
