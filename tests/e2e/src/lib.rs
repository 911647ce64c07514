//! Fixtures for the end-to-end tests.
