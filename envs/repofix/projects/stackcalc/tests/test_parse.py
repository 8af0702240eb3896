import unittest

from stackcalc import to_rpn, tokenize


class TestTokenize(unittest.TestCase):
    def test_numbers_and_ops(self):
        self.assertEqual(tokenize("12+3.5*(4-1)"), ["12", "+", "3.5", "*", "(", "4", "-", "1", ")"])

    def test_spaces(self):
        self.assertEqual(tokenize(" 1 +  2 "), ["1", "+", "2"])

    def test_bad_char(self):
        with self.assertRaises(ValueError):
            tokenize("1 & 2")


class TestRpn(unittest.TestCase):
    def test_precedence(self):
        self.assertEqual(to_rpn(tokenize("1+2*3")), ["1", "2", "3", "*", "+"])

    def test_left_assoc(self):
        self.assertEqual(to_rpn(tokenize("8-3-2")), ["8", "3", "-", "2", "-"])

    def test_right_assoc_power(self):
        self.assertEqual(to_rpn(tokenize("2^3^2")), ["2", "3", "2", "^", "^"])

    def test_parentheses(self):
        self.assertEqual(to_rpn(tokenize("(1+2)*3")), ["1", "2", "+", "3", "*"])

    def test_unbalanced(self):
        with self.assertRaises(ValueError):
            to_rpn(tokenize("(1+2"))
        with self.assertRaises(ValueError):
            to_rpn(tokenize("1+2)"))


if __name__ == "__main__":
    unittest.main()
