"""One module per headless subcommand; each has run(args) -> exit status."""
