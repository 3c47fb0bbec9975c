"""One module per subcommand: the logic each command of ``cli`` calls, as plain functions of typed arguments.

``cli`` parses the command line and dispatches here; these modules print their results and raise a
BottleError for the one message ``cli.main`` shows. They import what they use when called, so that
``claude-bottle --help`` and the gate (whose image has no Docker SDK) load only what they need.
"""
