"""The pytest runner of a grade: runs in the task's sandbox, as `python3 -c <this file's text>`.

The code under test runs in this process, so whatever this process writes can be forged by it.
What decides a grade is therefore sent while the tests run, over a channel the host reads:

* The runner's fd 3 is the channel (the grader's command opens it on its own stdout and sends
  everything else to stderr; the runner moves it to a descriptor no child inherits). One JSON line
  per test report goes out as pytest makes it, numbered and signed with a key the host left in
  `KEY_FILE` (its first line; then the ids of the tests the grade reads, as a JSON list), read and
  deleted before the tree is imported and then held by the audit hook alone;
  then an `end` line with pytest's exit status, and the process leaves at once (`os._exit`: no
  `atexit` handler runs after it). The host (`grading.read_channel`) refuses a record that is not
  signed, out of order, twice, or after the end, a channel without an end, and an exit status
  other than pytest's: nothing that runs after a test can change what was sent about it.
* Before any of the working tree is imported, an audit hook (PEP 578: it cannot be removed once
  added) refuses, and reports on the channel, what a fix has no business doing in a test run: gc
  introspection (the way to the hook and the runner's objects), tracing and profiling hooks,
  ctypes and `marshal` from the tree's code, opening any process's memory, making code named
  like a library's file, replacing the code of a library's functions. The process is made
  non-dumpable, so nothing it starts can attach to it or read or write its memory.
* With each call's record (and each failure's) of a test the grade reads (a check costs about
  0.5 ms, and a suite may have thousands of tests the grade does not read), the hook also checks that pytest's and pluggy's
  modules and classes are as they were before the tree was imported (or as pytest itself set
  them, from its own functions), that every hook implementation pytest would call was registered
  by pytest's own code or a conftest, not by code under test calling `register`, and that the
  test still runs the function collected for it. Records come only from this file's plugin,
  called by pytest's own code.

Any refusal or failed check is a `violation` record: the grade is unresolved. What this does not
stop is in the security table, docs/security.md (in one process nothing is airtight). Python before 3.8
has no audit hooks: the channel and the checks still run, unprotected.

Written for every Python and pytest a SWE-bench image may hold (3.6+, pytest 4.6+, pluggy 0.13+).
"""
# ruff: noqa: UP031, B905, RUF021, I001, E401
# mypy: ignore-errors

import os
import sys
from itertools import chain, repeat
from operator import is_, methodcaller

keys_of, values_of = methodcaller("keys"), methodcaller("values")

ALWAYS_REFUSED = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames")
"""The ways to the runner's objects that no test needs."""
REFUSED_TO_CODE_UNDER_TEST = ("sys.settrace", "sys.setprofile", "marshal.loads", "sys.monitoring.register_callback")
"""Refused when the code that asks is the working tree's (or made at run time): doctest and a
coverage plugin trace, importlib unmarshals, and their code is not the tree's."""
WATCHED = frozenset(
    (
        "orchard.grade",
        "compile",
        "code.__new__",
        "object.__setattr__",
        "open",
        *ALWAYS_REFUSED,
        *REFUSED_TO_CODE_UNDER_TEST,
    )
)
RUNNER_MODULES = ("pytest", "_pytest", "pluggy")
MUTABLE = {
    "_pytest.assertion.util": ("_reprcompare", "_assertion_pass", "_config"),
    "_pytest.debugging.pytestPDB": ("_pluginmanager", "_config", "_wrapped_pdb_cls"),
}
"""What pytest itself sets to its own objects in its modules and classes while it runs."""


KEY_FILE = "/tmp/orchard-grade.key"
"""Where the host leaves the key that signs the channel's records (`ORCHARD_GRADE_KEY_FILE`
names another place); read and deleted at start."""


def _seal(channel, json, hmac, plugin_codes, main_frame, cwd):
    """The audit hook: a closure, so its state (the key above all) is reachable only through the
    hook itself, and the hook through nothing Python offers."""
    path = os.environ.pop("ORCHARD_GRADE_KEY_FILE", KEY_FILE)
    try:
        with open(path, "rb") as file:
            key, _, tests = file.read().partition(b"\n")
        os.unlink(path)
    except OSError:  # not started by a grader: records go out unsigned, and no grader reads them
        key, tests = b"", b""
    graded = frozenset(json.loads(tests)) if tests.strip() else None  # the tests the grade reads
    state = {"n": 0, "armed": False, "ended": False}
    items = {}  # test item -> (it, its test function) when collection finished
    dicts = []  # [owner, its label, its names, their values, its live namespace] of each runner module and class
    function = type(_seal)
    tree_files = set()  # the files of the tree imported before it was sealed (pytest's own tasks)
    namespaces = []  # the globals of every module imported before the seal
    sanctioned = {}  # hook implementation -> (it, its function) as pytest registered it
    tree = cwd.rstrip("/") + "/"

    def write(record):
        record["n"] = state["n"]
        state["n"] += 1
        payload = json.dumps(record, sort_keys=True).encode()
        os.write(channel, payload + b"\t" + hmac.new(key, payload, "sha256").hexdigest().encode() + b"\n")

    def violation(what):
        write({"violation": what})
        raise RuntimeError("orchard: %s is not allowed in a graded test run" % what)

    def snapshot(owner, label):
        namespace = vars(owner)  # a class's is a live view of its namespace
        dicts.append([owner, label, list(namespace), list(namespace.values()), namespace])

    def arm(pm):
        for name, module in list(sys.modules.items()):
            if module is None:
                continue
            namespaces.append(vars(module))
            path = vars(module).get("__file__")  # no lookup: a module's `__getattr__` may run code
            if isinstance(path, str) and path.startswith(tree):
                tree_files.add(path)
            if name.split(".")[0] in RUNNER_MODULES or name == "__main__":
                snapshot(module, name)
                for value in list(vars(module).values()):
                    if isinstance(value, type) and value.__module__ == name:
                        snapshot(value, name + "." + value.__qualname__)
        flatten()
        state["pm"], state["hookexec"] = pm, pm._inner_hookexec
        state["runner_is_tree"] = any(
            (getattr(sys.modules.get(name), "__file__", None) or "").startswith(tree) for name in ("_pytest", "pluggy")
        )
        for caller in list(vars(pm.hook).values()):
            for impl in caller.get_hookimpls():
                sanctioned[impl] = (impl, impl.function)
        state["armed"] = True

    def under_test(code):
        """Whether `code` is the working tree's, or was made at run time, not a library's: a
        library's code has its file's absolute path outside the tree, and code under test cannot
        make code of such a name (`compile` and `code.__new__` are refused it)."""
        name = code.co_filename
        if name.startswith(tree):
            return name not in tree_files
        return not (os.path.isabs(name) or name.startswith("<frozen "))

    def trusted_chain(frame):
        """Whether every frame from `frame` up to the runner's is a library's or a conftest's:
        what registers plugins and reports tests is pytest, not code under test."""
        while frame is not None and frame is not main_frame:
            code = frame.f_code
            if under_test(code) and os.path.basename(code.co_filename) != "conftest.py":
                return False
            frame = frame.f_back
        return frame is not None

    def test_function(item):
        obj = vars(item).get("_obj")
        return getattr(obj, "__func__", obj)

    def check_item(frame):
        """The test being reported still runs the function collected for it."""
        while frame is not None and frame.f_code.co_name != "call_and_report":
            frame = frame.f_back
        item = frame.f_locals.get("item") if frame is not None else None
        if item is None:
            return
        if "runtest" in vars(item):
            violation("replacing how %s runs" % item.nodeid)
        known = items.get(item)
        if known is not None and known[0] is item and known[1] is not None:
            now = test_function(item)
            if now is not None and now is not known[1]:
                violation("replacing the test function of %s" % item.nodeid)

    def register(plugin, frame):
        if not state["runner_is_tree"] and not trusted_chain(frame):
            violation("registering a pytest plugin from code under test")
        for caller in list(vars(state["pm"].hook).values()):
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and impl not in sanctioned:
                    sanctioned[impl] = (impl, impl.function)

    def benign(value):
        """Whether pytest itself may have set `value` in one of its modules or classes while it
        runs (its `legacypath` plugin does): plain data, or a function imported before the tree."""
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return True
        if isinstance(value, (staticmethod, classmethod)):
            return benign(value.__func__)
        if isinstance(value, property):
            return all(f is None or benign(f) for f in (value.fget, value.fset, value.fdel))
        return (
            isinstance(value, function)
            and not under_test(value.__code__)
            and any(map(is_, repeat(value.__globals__), namespaces))
            and value.__closure__ is None
        )

    def flatten():
        """Every runner module's and class's names and values, in one list each, for `unchanged`
        (those pytest changes itself as it runs, `MUTABLE`'s, left out: `changes` reads them)."""
        proxies = [entry[4] for entry in dicts if entry[1] not in MUTABLE]
        state["size"] = sum(map(len, proxies))
        state["keys"] = list(chain.from_iterable(map(keys_of, proxies)))
        state["values"] = list(chain.from_iterable(map(values_of, proxies)))

    def unchanged():
        """Whether no runner module or class changed since `flatten`: identity, in C, in one pass
        (`builtins.id` is an audit event itself, and a loop in Python costs a test a millisecond)."""
        proxies = [entry[4] for entry in dicts if entry[1] not in MUTABLE]
        return (
            sum(map(len, proxies)) == state["size"]
            and all(map(is_, chain.from_iterable(map(keys_of, proxies)), state["keys"]))
            and all(map(is_, chain.from_iterable(map(values_of, proxies)), state["values"]))
        )

    def changes(entry):
        """A violation for what changed in one module or class that pytest would not have changed;
        what it did change is taken as the new state."""
        _, label, keys, values, namespace = entry
        old = dict(zip(keys, values))
        for key, value in list(namespace.items()):
            allowed = key == "__warningregistry__" or key in MUTABLE.get(label, ())  # `warnings`' own
            if old.get(key, old) is not value and not benign(value) and not allowed:
                violation("changing the test runner's %s.%s" % (label, key))
        entry[2:4] = [list(namespace), list(namespace.values())]

    def check():
        if state["runner_is_tree"]:
            return  # pytest is the code under test (pytest's own tasks): its tests change it
        for entry in dicts:
            if entry[1] in MUTABLE:
                changes(entry)
        if not unchanged():
            for entry in dicts:
                changes(entry)
            flatten()

    def check_hooks():
        pm = state["pm"]
        if pm._inner_hookexec is not state["hookexec"]:
            violation("replacing pluggy's hook calls")
        for caller in list(vars(pm.hook).values()):
            for impl in caller.get_hookimpls():
                known = sanctioned.get(impl)
                if known is None or known[0] is not impl or known[1] is not impl.function:
                    violation("a pytest hook implementation added by code under test (%s)" % caller.name)

    def grading_record(args):
        frame = sys._getframe(2)
        if frame.f_code is standin.__code__:
            frame = frame.f_back
        if not any(frame.f_code is c for c in plugin_codes) or state["ended"]:
            violation("a forged grading record")
        kind, caller = args[0], frame.f_back
        if kind == "arm" and not state["armed"]:
            arm(args[1])
        elif kind == "register" and state["armed"]:
            register(args[1], caller)
        elif kind == "collected" and state["armed"] and trusted_chain(caller):
            for item in list(args[1]):
                items[item] = (item, test_function(item))
        elif kind == "report" and state["armed"] and trusted_chain(caller):
            record = args[1]
            test = record["id"]
            if (record["when"] == "call" or record["outcome"] != "passed") and (  # what a forgery must change
                graded is None or test in graded or test.split(" ", 1)[0] in graded  # of a test the grade reads
            ):
                check()
                check_hooks()
            check_item(caller)
            write(record)
        elif kind == "end" and caller is main_frame:
            if state["armed"]:
                check()
                check_hooks()
            state["ended"] = True
            write({"end": args[1]})
        else:
            violation("a forged grading record")

    def hook(event, args):
        if event not in WATCHED and not event.startswith("ctypes."):
            return  # most events (`builtins.id`, attribute reads, imports) as fast as can be
        if event == "orchard.grade":
            grading_record(args)
        elif not state["armed"] or state["ended"]:
            return
        elif event in ALWAYS_REFUSED:
            violation(event)
        elif event in REFUSED_TO_CODE_UNDER_TEST or event.startswith("ctypes."):
            frame = sys._getframe(1)
            while event.startswith("ctypes.") and frame.f_back and "/ctypes/" in frame.f_code.co_filename:
                frame = frame.f_back  # ctypes' own helpers (`string_at`, `memmove`): who called them
            if under_test(frame.f_code):
                violation(event)
        elif event in ("compile", "code.__new__"):
            name = os.fsdecode(args[1]) if isinstance(args[1], (str, bytes)) else ""
            library = os.path.isabs(name) and not name.startswith(tree) or name.startswith("<frozen ")
            if (library or name in tree_files) and under_test(sys._getframe(1).f_code):
                violation("code under test making code named %s" % name)  # passing for a library's
        elif event == "object.__setattr__" and args[1] == "__code__":
            code = getattr(args[0], "__code__", None)
            if code is not None and not under_test(code) and under_test(sys._getframe(1).f_code):
                violation("replacing the code of %s" % getattr(args[0], "__qualname__", "a runner function"))
        elif event == "open" and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            if path == "/dev/mem" or path.startswith("/proc/") and path.rstrip("/").endswith("/mem"):
                violation("opening %s" % path)

    def standin(event, *args):
        """`sys.audit` where Python has none (before 3.8): the hook called directly."""
        hook(event, args)

    return hook, standin


class Recorder:
    """The pytest plugin that hands each report to the seal."""

    def __init__(self, audit):
        self.audit = audit

    def pytest_load_initial_conftests(self, early_config):
        """Seal before the first conftest (and through it the tree) is imported."""
        pm = early_config.pluginmanager
        register = pm.register

        def sealed_register(plugin, name=None):
            done = register(plugin, name)
            self.audit("orchard.grade", "register", plugin)
            return done

        pm.register = sealed_register
        self.audit("orchard.grade", "arm", pm)

    def pytest_collection_finish(self, session):
        self.audit("orchard.grade", "collected", session.items)

    def pytest_runtest_logreport(self, report):
        record = {"id": report.nodeid, "when": report.when, "outcome": report.outcome}
        record["xfail"] = hasattr(report, "wasxfail")
        self.audit("orchard.grade", "report", record)

    def end(self, status):
        self.audit("orchard.grade", "end", status)


def main():
    channel = os.dup(3)  # not inheritable: nothing the tests start holds it
    os.close(3)
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)] + [cwd]
    import hmac
    import json
    import cmd, code, codeop, doctest, faulthandler, pdb  # noqa: F401  (before the tree can shadow them)
    import pytest

    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
    except Exception:  # no ctypes, or not Linux
        pass
    load = Recorder.pytest_load_initial_conftests
    Recorder.pytest_load_initial_conftests = pytest.hookimpl(tryfirst=True)(load)
    codes = [load.__code__, Recorder.pytest_runtest_logreport.__code__, Recorder.end.__code__]
    codes += [Recorder.pytest_collection_finish.__code__]
    codes += [c for c in load.__code__.co_consts if type(c).__name__ == "code"]
    hook, standin = _seal(channel, json, hmac, codes, sys._getframe(), cwd)
    if hasattr(sys, "addaudithook"):
        sys.addaudithook(hook)
        audit = sys.audit
    else:
        audit = standin
    recorder = Recorder(audit)
    status = int(pytest.main(plugins=[recorder]))
    recorder.end(status)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
