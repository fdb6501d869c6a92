"""The command line: `cli_parser` (every command's flags and help), `cli` (each command: run,
build, sweep, tune, match, intrinsics, ...) and the HTML report. The top room: it may import
every other."""
