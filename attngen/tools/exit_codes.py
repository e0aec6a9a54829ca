"""The exit codes of every `attngen` command, in one place (cli, compile, fuzz, bench)."""

EXIT_OK = 0
EXIT_SPEC = 1  # a spec error, rendered compiler-style on stderr
EXIT_FAIL = EXIT_SPEC  # fuzz, bench: a failure found (a disagreeing output) is the same code as a spec error
EXIT_USAGE = 2
EXIT_INTERNAL = 3  # a bug in attngen, not in the user's input
