"""Embedded demo data: scikit-learn's bundled digits and sample images; nothing is downloaded."""
