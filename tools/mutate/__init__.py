"""Mutation testing of the core; see README.md here."""
