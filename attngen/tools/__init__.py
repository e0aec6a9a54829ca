"""The commands: cli (`attngen ...`), explain, compile, bench."""
