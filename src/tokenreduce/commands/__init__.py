"""CLI subcommands; one module each, registered in tokenreduce.cli.COMMANDS."""
