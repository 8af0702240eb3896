import unittest

from intervals import Interval


class TestBasics(unittest.TestCase):
    def test_empty_rejected(self):
        with self.assertRaises(ValueError):
            Interval(2, 1)

    def test_point_allowed(self):
        self.assertEqual(Interval(3, 3).length, 0)

    def test_length_and_midpoint(self):
        iv = Interval(2, 6)
        self.assertEqual(iv.length, 4)
        self.assertEqual(iv.midpoint, 4)

    def test_contains_ends(self):
        iv = Interval(0, 1)
        self.assertTrue(iv.contains(0))
        self.assertTrue(iv.contains(1))
        self.assertFalse(iv.contains(1.5))
        self.assertFalse(iv.contains(-0.5))


class TestRelations(unittest.TestCase):
    def test_overlap(self):
        self.assertTrue(Interval(0, 2).overlaps(Interval(1, 3)))

    def test_touching_overlaps(self):
        self.assertTrue(Interval(0, 1).overlaps(Interval(1, 2)))
        self.assertTrue(Interval(1, 2).overlaps(Interval(0, 1)))

    def test_disjoint(self):
        self.assertFalse(Interval(0, 1).overlaps(Interval(2, 3)))
        self.assertFalse(Interval(2, 3).overlaps(Interval(0, 1)))

    def test_intersection(self):
        self.assertEqual(Interval(0, 5).intersection(Interval(3, 8)), Interval(3, 5))

    def test_intersection_point(self):
        self.assertEqual(Interval(0, 3).intersection(Interval(3, 8)), Interval(3, 3))

    def test_intersection_none(self):
        self.assertIsNone(Interval(0, 1).intersection(Interval(2, 3)))

    def test_hull(self):
        self.assertEqual(Interval(0, 1).hull(Interval(4, 5)), Interval(0, 5))


class TestArithmetic(unittest.TestCase):
    def test_add(self):
        self.assertEqual(Interval(1, 2) + Interval(10, 20), Interval(11, 22))

    def test_sub(self):
        self.assertEqual(Interval(1, 2) - Interval(10, 20), Interval(-19, -8))

    def test_mul_positive(self):
        self.assertEqual(Interval(1, 2) * Interval(3, 4), Interval(3, 8))

    def test_mul_mixed_signs(self):
        self.assertEqual(Interval(-1, 2) * Interval(-3, 4), Interval(-6, 8))

    def test_scale_positive(self):
        self.assertEqual(Interval(1, 2).scale(3), Interval(3, 6))

    def test_scale_negative(self):
        self.assertEqual(Interval(1, 2).scale(-2), Interval(-4, -2))

    def test_scale_zero(self):
        self.assertEqual(Interval(1, 2).scale(0), Interval(0, 0))


if __name__ == "__main__":
    unittest.main()
