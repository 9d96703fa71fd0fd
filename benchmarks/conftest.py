"""Benchmark options: heavy sizes run only with --heavy."""


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true", default=False,
                     help="also run the large benchmark sizes (minutes)")
