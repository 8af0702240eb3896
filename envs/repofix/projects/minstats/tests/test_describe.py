import unittest

from minstats import mean, median, mode, stdev, variance


class TestCentral(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_mean_empty(self):
        with self.assertRaises(ValueError):
            mean([])

    def test_median_odd(self):
        self.assertEqual(median([5, 1, 3]), 3)

    def test_median_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

    def test_median_single(self):
        self.assertEqual(median([7]), 7)

    def test_mode(self):
        self.assertEqual(mode([1, 2, 2, 3]), 2)

    def test_mode_tie_smallest(self):
        self.assertEqual(mode([3, 3, 1, 1, 2]), 1)


class TestSpread(unittest.TestCase):
    def test_sample_variance(self):
        self.assertEqual(variance([2, 4, 4, 4, 5, 5, 7, 9]), 32 / 7)

    def test_population_variance(self):
        self.assertEqual(variance([2, 4, 4, 4, 5, 5, 7, 9], ddof=0), 4)

    def test_stdev_population(self):
        self.assertEqual(stdev([2, 4, 4, 4, 5, 5, 7, 9], ddof=0), 2)

    def test_variance_too_few(self):
        with self.assertRaises(ValueError):
            variance([1])
        self.assertEqual(variance([1], ddof=0), 0)


if __name__ == "__main__":
    unittest.main()
