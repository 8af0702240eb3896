import unittest

from intervals import Interval, gaps, merge, total_length


class TestMerge(unittest.TestCase):
    def test_overlapping(self):
        self.assertEqual(merge([Interval(5, 7), Interval(0, 2), Interval(1, 3)]),
                         [Interval(0, 3), Interval(5, 7)])

    def test_touching_merge(self):
        self.assertEqual(merge([Interval(0, 1), Interval(1, 2)]), [Interval(0, 2)])

    def test_contained(self):
        self.assertEqual(merge([Interval(0, 10), Interval(2, 3)]), [Interval(0, 10)])

    def test_empty(self):
        self.assertEqual(merge([]), [])


class TestTotalLength(unittest.TestCase):
    def test_union_length(self):
        self.assertEqual(total_length([Interval(0, 2), Interval(1, 3), Interval(10, 11)]), 4)

    def test_single(self):
        self.assertEqual(total_length([Interval(2, 7)]), 5)


class TestGaps(unittest.TestCase):
    def test_gaps_inside(self):
        self.assertEqual(gaps([Interval(1, 2), Interval(4, 5)], 0, 6),
                         [Interval(0, 1), Interval(2, 4), Interval(5, 6)])

    def test_fully_covered(self):
        self.assertEqual(gaps([Interval(-1, 7)], 0, 6), [])

    def test_outside_ignored(self):
        self.assertEqual(gaps([Interval(10, 12)], 0, 6), [Interval(0, 6)])

    def test_touching_no_point_gap(self):
        self.assertEqual(gaps([Interval(0, 3), Interval(3, 6)], 0, 6), [])


if __name__ == "__main__":
    unittest.main()
