"""inferop's core: the pure planning that the operator, export and the local runtime share (the `config.pbtxt`
renderer, thread, memory and queue budgets, quantities, answer agreement), the one error root and the `inferop`
command line. The operator image installs this and the operator only, not the local runtime (`inferop`)."""

__version__ = "0.1.0"
