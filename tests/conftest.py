import pytest

import tirbyoc


@pytest.fixture(scope="session")
def all_templates():
    return tirbyoc.templates()
