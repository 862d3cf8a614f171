"""The root of every error inferop raises on purpose, so a caller can catch ours and let a bug's through.

Each subclass says what the user got wrong or what failed, naming the field, file or value; the command line
prints it without a traceback. A subclass that is also a `ValueError` (bad input) or `RuntimeError` (a
component failed) keeps that base, so code that catches the builtin classes still works.
"""


class InferopError(Exception):
    """An error inferop raises on purpose, with a message a user can act on."""
