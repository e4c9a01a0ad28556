"""An app whose ``tasks`` module no test imports: tests/test_by_name_defaults.py checks that an
enqueue by name finds its ``@task`` anyway."""
