import unittest

from minstats import clamp, histogram, moving_average, percentile


class TestPercentile(unittest.TestCase):
    def test_ends(self):
        self.assertEqual(percentile([3, 1, 2], 0), 1)
        self.assertEqual(percentile([3, 1, 2], 100), 3)

    def test_interpolated(self):
        self.assertEqual(percentile([1, 2, 3, 4], 50), 2.5)
        self.assertEqual(percentile([0, 10], 25), 2.5)

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            percentile([1], 101)
        with self.assertRaises(ValueError):
            percentile([1], -1)


class TestClamp(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(5, 0, 10), 5)

    def test_edges(self):
        self.assertEqual(clamp(-1, 0, 10), 0)
        self.assertEqual(clamp(11, 0, 10), 10)
        self.assertEqual(clamp(10, 0, 10), 10)

    def test_bad_bounds(self):
        with self.assertRaises(ValueError):
            clamp(1, 2, 1)


class TestMovingAverage(unittest.TestCase):
    def test_window_two(self):
        self.assertEqual(moving_average([1, 3, 5, 7], 2), [2, 4, 6])

    def test_window_equal_len(self):
        self.assertEqual(moving_average([1, 2, 3], 3), [2])

    def test_window_too_long(self):
        self.assertEqual(moving_average([1, 2], 3), [])

    def test_window_one(self):
        self.assertEqual(moving_average([4, 5], 1), [4, 5])


class TestHistogram(unittest.TestCase):
    def test_counts(self):
        self.assertEqual(histogram([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 5, 0, 10), [2, 2, 2, 2, 3])

    def test_outside_dropped(self):
        self.assertEqual(histogram([-1, 11, 5], 2, 0, 10), [0, 1])

    def test_bad_bins(self):
        with self.assertRaises(ValueError):
            histogram([1], 0, 0, 1)


if __name__ == "__main__":
    unittest.main()
