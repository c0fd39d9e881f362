"""Test support: a recording HTTPS webhook receiver whose behaviour is set per endpoint path."""
