"""One module per `slotune` subcommand. Each defines NAME, HELP, EXAMPLES,
`add_arguments(parser)` and `run(args) -> int`; daemon.cli finds them here."""
