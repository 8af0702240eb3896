import unittest

from stackcalc import CalcError, evaluate, evaluate_rpn


class TestEvaluate(unittest.TestCase):
    def test_add_mul(self):
        self.assertEqual(evaluate("1+2*3"), 7)

    def test_sub_chain(self):
        self.assertEqual(evaluate("10-4-3"), 3)

    def test_div(self):
        self.assertEqual(evaluate("7/2"), 3.5)

    def test_mod(self):
        self.assertEqual(evaluate("17%5"), 2)

    def test_power_right_assoc(self):
        self.assertEqual(evaluate("2^3^2"), 512)

    def test_parens(self):
        self.assertEqual(evaluate("(2+3)*(4-1)"), 15)

    def test_decimal(self):
        self.assertAlmostEqual(evaluate("0.5*4+0.25"), 2.25)

    def test_div_zero(self):
        with self.assertRaises(CalcError):
            evaluate("1/0")

    def test_mod_zero(self):
        with self.assertRaises(CalcError):
            evaluate("1%0")

    def test_unbalanced_is_calc_error(self):
        with self.assertRaises(CalcError):
            evaluate("(1+2")


class TestRpnMachine(unittest.TestCase):
    def test_rpn(self):
        self.assertEqual(evaluate_rpn(["3", "4", "+", "2", "*"]), 14)

    def test_underflow(self):
        with self.assertRaises(CalcError):
            evaluate_rpn(["1", "+"])

    def test_leftover(self):
        with self.assertRaises(CalcError):
            evaluate_rpn(["1", "2"])

    def test_not_a_number(self):
        with self.assertRaises(CalcError):
            evaluate_rpn(["1..2"])


if __name__ == "__main__":
    unittest.main()
