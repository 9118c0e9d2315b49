"""Tests of the server-side assignors (``translation.assignors``)."""
