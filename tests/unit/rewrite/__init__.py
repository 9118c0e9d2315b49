"""Tests of the broker address rewriters."""
