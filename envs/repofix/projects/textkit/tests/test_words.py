import unittest

from textkit import (
    capitalize_words,
    is_palindrome,
    levenshtein,
    rle_decode,
    rle_encode,
    slugify,
    word_count,
)


class TestSlugify(unittest.TestCase):
    def test_basic(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_digits_and_runs_of_separators(self):
        self.assertEqual(slugify("  PEARL  v2 -- fast "), "pearl-v2-fast")

    def test_empty(self):
        self.assertEqual(slugify("!!!"), "")


class TestWordCount(unittest.TestCase):
    def test_counts(self):
        self.assertEqual(word_count("The cat, the hat."), {"the": 2, "cat": 1, "hat": 1})

    def test_punctuation_only_words_skipped(self):
        self.assertEqual(word_count("a -- ... b"), {"a": 1, "--": 1, "b": 1})

    def test_single_letter(self):
        self.assertEqual(word_count("I"), {"i": 1})


class TestCapitalize(unittest.TestCase):
    def test_words(self):
        self.assertEqual(capitalize_words("hello big world"), "Hello Big World")

    def test_keeps_rest(self):
        self.assertEqual(capitalize_words("mcDonald iPhone"), "McDonald IPhone")


class TestPalindrome(unittest.TestCase):
    def test_sentence(self):
        self.assertTrue(is_palindrome("A man, a plan, a canal: Panama"))

    def test_not(self):
        self.assertFalse(is_palindrome("abca"))

    def test_two_different(self):
        self.assertFalse(is_palindrome("ab"))

    def test_short(self):
        self.assertTrue(is_palindrome("x"))
        self.assertTrue(is_palindrome(""))


class TestRle(unittest.TestCase):
    def test_encode(self):
        self.assertEqual(rle_encode("aaabccd"), [("a", 3), ("b", 1), ("c", 2), ("d", 1)])

    def test_roundtrip(self):
        for s in ["", "a", "abba", "zzzzzzzzzz", "xyzzy"]:
            self.assertEqual(rle_decode(rle_encode(s)), s)

    def test_decode_rejects_zero(self):
        with self.assertRaises(ValueError):
            rle_decode([("a", 0)])

    def test_decode_one(self):
        self.assertEqual(rle_decode([("q", 1), ("r", 2)]), "qrr")


class TestLevenshtein(unittest.TestCase):
    def test_classic(self):
        self.assertEqual(levenshtein("kitten", "sitting"), 3)

    def test_empty(self):
        self.assertEqual(levenshtein("", "abc"), 3)
        self.assertEqual(levenshtein("abc", ""), 3)

    def test_equal(self):
        self.assertEqual(levenshtein("same", "same"), 0)

    def test_one_substitution(self):
        self.assertEqual(levenshtein("cat", "cut"), 1)


if __name__ == "__main__":
    unittest.main()
