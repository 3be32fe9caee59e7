"""Issue 36, items 3 and 4: the default allow list's packages (numpy, pandas, pyyaml, from the package index)
hand a program no loader that builds objects from bytes or runs text as code, on subprocess and docker; each
attack names the layer that stopped it (``sandbox/inside/packages.py``: a withheld name, a method disarmed in
the process, the unpickling floor); a pyyaml program runs end to end through ``sandforge exec`` and
``POST /v1/exec``; and the audit of every top-level name the packages expose is complete.

The programs go straight to ``Sandbox.execute`` (no host guardrail in front): the inside's own layers are
what is tested. The environments are built once per session and interpreter (numpy and pandas are large)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandforge.runtime.environments.builder import EnvironmentStore
from sandforge.runtime.environments.manifest import normalise
from sandforge.runtime.environments.policy import DependencyPolicy
from sandforge.runtime.environments.target import TargetCache
from sandforge.sandbox import EnvironmentMount, ExecutionRequest, Sandbox, SandboxConfig, seam
from sandforge.sandbox.protocol import BootSeam, ErrorType
from tests.conftest import BACKEND_PARAMS, SharedSandboxes, _docker_env, _require_backend
from tests.environments.helpers import require_index
from tests.sandbox.envbuild import target_for

pytestmark = pytest.mark.slow

REQUIREMENTS = ("numpy", "pandas", "pyyaml")
ALLOW = ("numpy", "pandas", "pyyaml", "python-dateutil", "six", "tzdata", "pytz")
#: A pickle whose one global is builtins.__import__, called with "os": the real ``os`` when unpickled.
OS_PICKLE = b"cbuiltins\n__import__\n(Vos\ntR.".hex()
PRELUDE = "import io\nimport numpy\nimport pandas\nimport yaml\nattack = bytes.fromhex(args[0])\n"

#: (attack, program, what the message says: the layer that stopped it)
ATTACKS = [
    ("numpy.load(allow_pickle=True)",
     "return repr(numpy.load(io.BytesIO(attack), allow_pickle=True))",
     "numpy.load(allow_pickle=True) and numpy.load(mmap_mode=...) are withheld"),  # wrapper
    ("numpy.lib.npyio.NpzFile (same object, another path)",
     "return repr(getattr(numpy.lib.npyio, 'Npz' + 'File'))", "numpy.lib.npyio.NpzFile is withheld"),
    ("numpy.lib.format.read_array", "return repr(numpy.lib.format.read_array(io.BytesIO(attack), True))",
     "numpy.lib.format.read_array is withheld"),
    ("ndarray.ctypes via getattr", "return repr(getattr(numpy.zeros(2), 'cty' + 'pes'))",
     "attribute 'ctypes' is withheld"),
    ("numpy.lib.stride_tricks.as_strided", "return repr(numpy.lib.stride_tricks.as_strided)",
     "as_strided is withheld"),
    ("numpy.testing.measure", "from numpy import testing\nreturn 1", "numpy.testing is withheld"),
    ("pandas.read_pickle", "return repr(pandas.read_pickle(io.BytesIO(attack)))", "pandas.read_pickle is withheld"),
    ("pandas.compat.pickle_compat", "return repr(pandas.compat.pickle_compat.loads(attack))",
     "pandas.compat.pickle_compat is withheld"),
    ("DataFrame.to_pickle", "pandas.DataFrame({'a': [1]}).to_pickle(io.BytesIO())\nreturn 1",
     "NDFrame.to_pickle is withheld"),  # disarmed in the process
    ("DataFrame.query", "return repr(pandas.DataFrame({'a': [1]}).query('a.__class__'))",
     "DataFrame.query is withheld"),  # disarmed
    ("pandas string dispatch", "return repr(pandas.Series([1]).agg('_' + '_class__'))",
     "pandas string dispatch of '__class__' is withheld"),  # disarmed
    ("pandas.eval", "return repr(pandas.eval('1 + 1'))", "pandas.eval is withheld"),
    ("yaml.unsafe_load", "return repr(yaml.unsafe_load('!!python/name:os.system'))", "yaml.unsafe_load is withheld"),
    ("yaml.full_load", "return repr(yaml.full_load('!!python/name:os.system'))", "yaml.full_load is withheld"),
    ("yaml.load(Loader=yaml.loader.UnsafeLoader)",
     "return repr(yaml.load('!!python/name:os.system', Loader=yaml.loader.UnsafeLoader))",
     "yaml.loader.UnsafeLoader is withheld"),
    ("yaml.load(Loader=a SafeLoader subclass adding UnsafeConstructor)",
     "return repr(yaml.constructor.UnsafeConstructor)", "yaml.constructor.UnsafeConstructor is withheld"),
    ("yaml construct_yaml_object",
     "class L(yaml.SafeLoader):\n    pass\n"
     "L.add_constructor('!x', lambda loader, node: loader.construct_yaml_object(node, dict))\n"
     "return repr(yaml.load('!x {a: 1}', Loader=L))", "SafeConstructor.construct_yaml_object is withheld"),
]  # fmt: skip

WORKS = (
    PRELUDE
    + """
buffer = io.BytesIO()
numpy.save(buffer, numpy.arange(3))
buffer.seek(0)
frame = pandas.read_csv(io.StringIO("a,b\\n1,2\\n3,4\\n"))
return {
    "npy": numpy.load(buffer).tolist(),
    "yaml": yaml.safe_load("k: [1, 2]"),
    "yaml_load_safe": yaml.load("k: 1", Loader=yaml.SafeLoader),
    "sum": int(frame["a"].sum()),
    "agg": int(frame.agg("sum")["b"]),
}
"""
)


class IndexEnvironments:
    """numpy + pandas + pyyaml from the package index, built once per interpreter for the session."""

    def __init__(self, root: Path) -> None:
        self.store = EnvironmentStore(root / "environments")
        self.targets = TargetCache(root / "targets")
        self.policy = DependencyPolicy(allow=ALLOW, source="index")
        self._mounts: dict[Any, EnvironmentMount] = {}

    def mount(self, sandbox: Sandbox, backend: str) -> EnvironmentMount:
        api = None if backend == "subprocess" else _docker_env().api
        target = target_for(sandbox, backend, self.targets, api)
        if target not in self._mounts:
            prepared = self.store.prepare(normalise(list(REQUIREMENTS)), self.policy, target)
            public = tuple(m for m in prepared.record.top_level if not m.startswith("_"))
            self._mounts[target] = EnvironmentMount(env_id=prepared.env_id, site=str(prepared.site), modules=public)
        return self._mounts[target]


@pytest.fixture(scope="session")
def index_envs(tmp_path_factory: pytest.TempPathFactory) -> IndexEnvironments:
    require_index()
    return IndexEnvironments(tmp_path_factory.mktemp("pkgenvs"))


@pytest.fixture(params=BACKEND_PARAMS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every backend: the container ones share one environment, built for the image's interpreter."""
    _require_backend(request.param)
    return str(request.param)


@pytest.fixture
def pkg_sandbox(backend: str, shared_sandboxes: SharedSandboxes) -> Sandbox:
    return shared_sandboxes.get(backend)


def test_every_loader_attack_is_stopped_by_its_layer(
    index_envs: IndexEnvironments, pkg_sandbox: Sandbox, backend: str
) -> None:
    mount = index_envs.mount(pkg_sandbox, backend)
    works = pkg_sandbox.execute(ExecutionRequest(code=WORKS, args=[OS_PICKLE], environment=mount))
    assert works.ok, (works.error_type, works.error_message, works.stderr[-2000:])
    assert works.value == {"npy": [0, 1, 2], "yaml": {"k": [1, 2]}, "yaml_load_safe": {"k": 1}, "sum": 4, "agg": 6}
    assert_every_attack_stopped(pkg_sandbox, mount)


def assert_every_attack_stopped(sandbox: Sandbox, mount: EnvironmentMount) -> None:
    """Each of `ATTACKS` is a ``sandbox_violation`` whose message names the layer that stopped it."""
    for name, code, layer in ATTACKS:
        outcome = sandbox.execute(ExecutionRequest(code=PRELUDE + code, args=[OS_PICKLE], environment=mount))
        assert outcome.error_type == ErrorType.SANDBOX_VIOLATION, (name, outcome.error_type, outcome.value,
                                                                   outcome.error_message)  # fmt: skip
        assert layer in (outcome.error_message or ""), (name, outcome.error_message)
        assert "module 'os'" not in json.dumps(outcome.value)


#: Issue 36 item 3's fix, every layer of it: withheld names and modules, the wrappers (``numpy.load`` without
#: ``allow_pickle``) and the unpickling floor.
PACKAGE_LAYERS = ("packages.refuse_value", "packages.check_import", "packages.wrapped", "packages.disarm_unpickling")


@pytest.mark.parametrize("tripwire_on", [True, False], ids=["tripwire", "no-tripwire"])
def test_numpy_load_of_a_pickle_with_the_package_layers_reverted(
    index_envs: IndexEnvironments, backend: str, tripwire_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``packages.py``'s layers reverted (the tests' seam), the real ``numpy.load(allow_pickle=True)``
    unpickles; the tripwire stops it at ``pickle.find_class``, before the global is looked up. Without the
    tripwire too, the attack hands the program the real ``os``: the seam really reverts the fix."""
    monkeypatch.setattr(seam, "ACTIVE", BootSeam(unwrapped=PACKAGE_LAYERS, tripwire_off=not tripwire_on))
    with Sandbox(SandboxConfig(backend=backend, pool_size=0)) as sb:  # type: ignore[arg-type]
        mount = index_envs.mount(sb, backend)
        outcome = sb.execute(ExecutionRequest(code=PRELUDE + ATTACKS[0][1], args=[OS_PICKLE], environment=mount))
    if not tripwire_on:
        assert outcome.ok and "module 'os'" in str(outcome.value), (outcome.error_type, outcome.error_message)
        return
    assert outcome.error_type == ErrorType.SANDBOX_VIOLATION, (outcome.error_type, outcome.value, outcome.stderr)
    assert outcome.security_event is not None
    assert (outcome.security_event.source, outcome.security_event.event) == ("tripwire", "pickle.find_class")
    assert outcome.value is None and "module 'os'" not in (outcome.error_message or "")


def _host_site(index_envs: IndexEnvironments) -> str:
    sb = Sandbox(SandboxConfig(backend="subprocess", pool_size=0))
    try:
        return index_envs.mount(sb, "subprocess").site
    finally:
        sb.close()


def test_the_unpickling_floor_holds_without_the_first_layer(index_envs: IndexEnvironments) -> None:
    """With the wrappers and withheld names out of the way (the real ``numpy.load`` and ``pickle.loads``
    called directly), the floor alone refuses every global and still reads data-only pickles."""
    script = f"""
import io, pickle, sys
sys.path.append({_host_site(index_envs)!r})
from sandforge.sandbox.inside import packages
packages.disarm_unpickling()
import numpy
out = {{"data": pickle.loads(pickle.dumps([1, "a", {{"k": 2.5}}]))}}
for name, call in (("pickle", lambda: pickle.loads(bytes.fromhex({OS_PICKLE!r}))),
                   ("numpy", lambda: numpy.load(io.BytesIO(bytes.fromhex({OS_PICKLE!r})), allow_pickle=True))):
    try:
        out[name] = repr(call())
    except Exception as exc:
        out[name] = str(exc)
from sandforge.sandbox.inside import world
out["violations"] = world.VIOLATIONS
print(__import__("json").dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["data"] == [1, "a", {"k": 2.5}]
    assert out["pickle"].startswith("unpickling builtins.__import__ is withheld"), out
    assert "module 'os'" not in out["numpy"]  # numpy rewords the error; the violation is sticky all the same
    assert len(out["violations"]) == 2 and all(v.startswith("unpickling builtins") for v in out["violations"])


def test_the_audit_of_what_allowed_packages_expose_is_complete(index_envs: IndexEnvironments) -> None:
    script = f"""
import json, sys
sys.path.append({_host_site(index_envs)!r})
import numpy, pandas, yaml
from sandforge.sandbox.inside import packages
print(json.dumps({{top: packages.audit(top) for top in ("numpy", "pandas", "yaml")}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    table: dict[str, dict[str, str]] = json.loads(done.stdout.splitlines()[-1])
    unaudited = {f"{top}.{name}": verdict for top, names in table.items() for name, verdict in names.items()
                 if verdict.startswith("UNAUDITED")}  # fmt: skip
    assert not unaudited
    for dotted in ("numpy.load", "numpy.ctypeslib", "numpy.testing", "pandas.read_pickle", "pandas.eval",
                   "yaml.unsafe_load", "yaml.full_load", "yaml.Loader"):  # fmt: skip
        top, name = dotted.split(".", 1)
        assert dotted == "numpy.load" or table[top][name].startswith("withheld"), (dotted, table[top][name])
    assert table["yaml"]["safe_load"] == "own" and table["yaml"]["io"].startswith("unreachable")


PYYAML_PROGRAM = """# /// script
# dependencies = ["pyyaml"]
# ///
import yaml
return yaml.safe_load(args[0])
"""


def test_a_pyyaml_program_runs_through_sandforge_exec(index_envs: IndexEnvironments, tmp_path: Path) -> None:
    program = tmp_path / "yml.py"
    program.write_text(PYYAML_PROGRAM)
    env = {**os.environ, "SANDFORGE_STATE_DIR": str(tmp_path / "state"),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "sandforge", "exec", str(program), "--args", '["a: [1, 2]"]',
                           "--json", "--timeout", "30"], capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert json.loads(done.stdout)["value"] == {"a": [1, 2]}


def test_a_pyyaml_program_runs_through_post_v1_exec(index_envs: IndexEnvironments, tmp_path: Path) -> None:
    from sandforge.runtime.service.app import create_app
    from sandforge.runtime.service.audit import AuditLog
    from sandforge.runtime.service.tenants import hash_token, new_token, parse_server_config

    token = new_token()
    tenant = {"name": "t", "token_hashes": [hash_token(token)], "quotas": {"max_timeout_s": 60}}
    config = parse_server_config({"state_dir": str(tmp_path / "state"), "tenants": [tenant]}, base=tmp_path)
    gate = create_app(config, audit=AuditLog(None)).state.gate

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://t",
                                     headers={"Authorization": f"Bearer {token}"}, timeout=600) as client:  # fmt: skip
            return await client.post("/v1/exec", json={"code": PYYAML_PROGRAM, "args": ["a: 1"], "timeout_s": 30})

    response = asyncio.run(post())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["status"] == "ok" and body["value"] == {"a": 1}, body
