"""The unpickler that reads dcp/.metadata refuses every global a DCP metadata file does
not hold. Each payload is written opcode by opcode (GLOBAL or STACK_GLOBAL, then REDUCE),
so nothing dangerous runs if a check is missing: the calls aim at paths under tmp_path, and
the test asserts those were neither created nor removed."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import pytest

from astrai_core.checkpoints.safe_dcp import read_dcp_metadata
from astrai_core.errors import CheckpointError


def _global(module: str, name: str, stack: bool) -> bytes:
    if not stack:  # GLOBAL: "c<module>\n<name>\n"
        return b"c" + f"{module}\n{name}\n".encode()
    encoded = [text.encode() for text in (module, name)]
    return b"".join(pickle.SHORT_BINUNICODE + struct.pack("<B", len(text)) + text
                    for text in encoded) + pickle.STACK_GLOBAL


def _value(value: object) -> bytes:
    """The opcodes that push a plain value (str, int, list, tuple): no globals."""
    return pickle.dumps(value, protocol=2)[2:-1]  # without PROTO and STOP


def _call(function: bytes, *args: bytes) -> bytes:
    return function + pickle.MARK + b"".join(args) + pickle.TUPLE + pickle.REDUCE


def _pickle(expression: bytes) -> bytes:
    return pickle.PROTO + b"\x04" + expression + pickle.STOP


def _simple(module: str, name: str, *args):
    """(the refused global's name, a builder of the payload given (tmp_path, stack)): a
    call of module.name on ``args``, each callable one applied to tmp_path first."""
    def build(tmp: Path, stack: bool) -> bytes:
        values = [arg(tmp) if callable(arg) else arg for arg in args]
        return _call(_global(module, name, stack), *(_value(v) for v in values))
    return f"{module}.{name}", build


def _marker(tmp: Path) -> str:
    return str(tmp / "payload_ran")


def _victim(tmp: Path) -> str:
    return str(tmp / "victim")


def _touch(tmp: Path) -> str:
    return f"touch {_marker(tmp)}"


def _code(tmp: Path) -> str:
    return f"open({_marker(tmp)!r}, 'w').write('ran')"


def _partial_chain(tmp: Path, stack: bool) -> bytes:
    """functools.partial(torch.save, 'ran', marker)() ."""
    inner = _call(_global("functools", "partial", stack), _global("torch", "save", stack),
                  _value("ran"), _value(_marker(tmp)))
    return inner + pickle.EMPTY_TUPLE + pickle.REDUCE


def _nested_pickle(tmp: Path, stack: bool) -> bytes:
    """pickle.loads(a pickle that calls builtins.exec): the second unpickler is plain."""
    hostile = _pickle(_call(_global("builtins", "exec", False), _value(_code(tmp))))
    return _call(_global("pickle", "loads", stack), _value(hostile))


def _allowed_class_method(tmp: Path, stack: bool) -> bytes:
    """pathlib.PosixPath is allowed (StorageMeta.checkpoint_id); its method write_text,
    reached by a dotted name, is not: PosixPath.write_text(PosixPath(marker), 'ran')."""
    path = _call(_global("pathlib", "PosixPath", stack), _value(_marker(tmp)))
    return _call(_global("pathlib", "PosixPath.write_text", stack), path, _value("ran"))


# refused global -> its payload's builder, given (tmp_path, stack)
HOSTILE = dict([
    _simple("torch", "save", "ran", _marker),
    _simple("torch", "load", _marker),
    _simple("torch.serialization", "save", "ran", _marker),  # an allowed module, other name
    _simple("torch.serialization", "load", _marker),
    _simple("torch.jit", "load", _marker),
    _simple("torch.hub", "_load_local", _victim, "model"),  # runs victim/hubconf.py
    _simple("torch.distributed.checkpoint.metadata", "torch"),  # a module attribute
    _simple("os", "system", _touch),
    _simple("posix", "system", _touch),
    _simple("os", "remove", _victim),
    _simple("subprocess", "Popen", lambda tmp: ["touch", _marker(tmp)]),
    _simple("subprocess", "run", lambda tmp: ["touch", _marker(tmp)]),
    _simple("subprocess", "check_output", lambda tmp: ["touch", _marker(tmp)]),
    _simple("builtins", "eval", _code),
    _simple("builtins", "exec", _code),
    _simple("builtins", "compile", _code, "<payload>", "exec"),
    _simple("builtins", "getattr", "", "join"),
    _simple("builtins", "__import__", "os"),
    _simple("builtins", "open", _marker, "w"),
    _simple("builtins", "set.__class__"),  # type, through an allowed name
    _simple("io", "open", _marker, "w"),
    _simple("_io", "open", _marker, "w"),
    _simple("importlib", "import_module", "os"),
    _simple("numpy", "load", _marker),
    _simple("numpy", "fromfile", _marker),
    _simple("numpy.lib.npyio", "load", _marker),
    _simple("numpy.lib._npyio_impl", "load", _marker),
    _simple("numpy", "save", _marker, 1),
    _simple("shutil", "rmtree", _victim),
    _simple("collections", "OrderedDict.fromkeys", "ab"),  # a method of an allowed class
    ("functools.partial", _partial_chain),
    ("pickle.loads", _nested_pickle),
    ("pathlib.PosixPath.write_text", _allowed_class_method),
])


@pytest.mark.parametrize("stack", [False, True], ids=["GLOBAL", "STACK_GLOBAL"])
@pytest.mark.parametrize("refused", sorted(HOSTILE))
def test_a_hostile_global_is_refused_and_never_called(tmp_path, refused, stack):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "kept").write_text("kept")
    data = _pickle(HOSTILE[refused](tmp_path, stack))
    with pytest.raises(CheckpointError) as raised:
        read_dcp_metadata(data, "ckpt/dcp/.metadata")
    message = str(raised.value)
    assert f"{refused} is not allowed in DCP metadata" in message
    assert message.startswith("ckpt/dcp/.metadata is not a checkpoint's DCP metadata")
    assert not (tmp_path / "payload_ran").exists()
    assert (victim / "kept").read_text() == "kept"


def test_the_payloads_would_run_under_a_plain_unpickler(tmp_path):
    """The table's calls are real: a plain unpickler runs one (torch.save) and creates the
    marker, so the assertions above test refusals, not broken payloads."""
    pickle.loads(_pickle(HOSTILE["torch.save"](tmp_path, True)))
    assert (tmp_path / "payload_ran").exists()
