"""stackcalc: tokenize, convert to RPN, evaluate on a stack."""

from stackcalc.machine import CalcError, evaluate, evaluate_rpn
from stackcalc.parse import to_rpn, tokenize

__all__ = ["CalcError", "evaluate", "evaluate_rpn", "to_rpn", "tokenize"]
