import unittest

from textkit import center, truncate, wrap


class TestWrap(unittest.TestCase):
    def test_fits_on_one_line(self):
        self.assertEqual(wrap("a b c", 5), ["a b c"])

    def test_breaks_at_width(self):
        self.assertEqual(wrap("the quick brown fox", 10), ["the quick", "brown fox"])

    def test_exact_width_kept_together(self):
        self.assertEqual(wrap("abcd efgh", 9), ["abcd efgh"])

    def test_long_word_alone(self):
        self.assertEqual(wrap("a verylongword b", 4), ["a", "verylongword", "b"])

    def test_empty(self):
        self.assertEqual(wrap("   ", 3), [])

    def test_bad_width(self):
        with self.assertRaises(ValueError):
            wrap("x", 0)

    def test_width_one(self):
        self.assertEqual(wrap("a b", 1), ["a", "b"])


class TestTruncate(unittest.TestCase):
    def test_short_unchanged(self):
        self.assertEqual(truncate("hello", 5), "hello")

    def test_cut_with_suffix(self):
        self.assertEqual(truncate("hello world", 8), "hello...")

    def test_custom_suffix(self):
        self.assertEqual(truncate("abcdef", 4, suffix="~"), "abc~")

    def test_limit_equal_to_suffix(self):
        self.assertEqual(truncate("abcdef", 3), "...")

    def test_limit_too_small(self):
        with self.assertRaises(ValueError):
            truncate("abcdef", 2)


class TestCenter(unittest.TestCase):
    def test_even_padding(self):
        self.assertEqual(center("ab", 6), "  ab  ")

    def test_odd_padding_goes_right(self):
        self.assertEqual(center("ab", 5, "*"), "*ab**")

    def test_too_wide(self):
        self.assertEqual(center("abcdef", 4), "abcdef")

    def test_exact(self):
        self.assertEqual(center("abc", 3), "abc")

    def test_bad_fill(self):
        with self.assertRaises(ValueError):
            center("a", 3, "--")


if __name__ == "__main__":
    unittest.main()
