"""Command-line interface: one module per subcommand, registered in ``main.COMMANDS``."""
