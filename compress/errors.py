"""The one exception type that the CLI turns into a single line and exit code 2."""


class UserError(Exception):
    """Bad input from the user: the message says what is wrong and what to do."""
