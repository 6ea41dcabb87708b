"""A small Django app whose models, migrations and queries the embedded server is tested with
(``tests/integration/test_django.py`` runs them in a process of their own)."""
