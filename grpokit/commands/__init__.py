"""Every subcommand of the CLI, one module each (``register(subparsers)`` and its ``run_*``), and what they share
(running.py, user_errors.py); grpokit/cli.py only parses and dispatches. A module with a command's heavy work
(env_report.py, explanation.py) is imported only when its command runs."""
