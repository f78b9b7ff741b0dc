"""What one test leaves for the next in the same pytest process: an in-process pytest run (pytester)
keeps the library modules it imported, so that a later test's `from mgpu import run` and mgpu's own
`from mgpu.run import train` name one module (root conftest.py, pytest_runtest_protocol)."""

import sys

import mgpu


def test_a_module_first_imported_in_an_in_process_pytest_run_stays_the_one_its_package_names(pytester, monkeypatch):
    # As if nothing had imported mgpu.run yet in this process; monkeypatch puts both back afterwards.
    monkeypatch.delitem(sys.modules, "mgpu.run", raising=False)
    monkeypatch.delattr(mgpu, "run", raising=False)
    pytester.makepyfile(test_imports_run="def test_imports_run():\n    import mgpu.run\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    assert result.ret == 0, result.stdout.str()[-2000:]
    assert "mgpu.run" in sys.modules, "pytester dropped mgpu.run from sys.modules after its run"
    assert sys.modules["mgpu.run"] is mgpu.run, "mgpu.run and sys.modules['mgpu.run'] are two modules"
    assert "test_imports_run" not in sys.modules, "the run's own test file should go, so that the next run imports it anew"
