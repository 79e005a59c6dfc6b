"""API keys of the service: `gpuir serve-keys` add/revoke/list, hashed storage, verification."""

from __future__ import annotations

import hashlib
import json
import stat

import pytest

from gpuir.service import cli
from gpuir.service.keys import KEYS_FILE, KeyStore, parse_key, tenant_of_key


def _add(root, tenant, capsys):
    assert cli.main(["serve-keys", str(root), "add", tenant]) == 0
    return capsys.readouterr().out.strip()


def test_add_prints_a_key_stored_only_hashed(tmp_path, capsys):
    root = tmp_path / "mem"
    k1 = _add(root, "alice", capsys)
    k2 = _add(root, "alice", capsys)
    assert k1 != k2 and k1.startswith("gpuir.alice.") and len(k1.split(".", 2)[2]) >= 40
    text = (root / KEYS_FILE).read_text()
    assert k1 not in text and k1.split(".", 2)[2] not in text
    data = json.loads(text)
    e1, e2 = data["keys"]
    assert e1["salt"] != e2["salt"] and len(bytes.fromhex(e1["salt"])) == 16
    assert e1["sha256"] == hashlib.sha256(bytes.fromhex(e1["salt"]) + k1.encode()).hexdigest()
    assert stat.S_IMODE((root / KEYS_FILE).stat().st_mode) == 0o600
    assert not [p for p in root.iterdir() if ".tmp-" in p.name]  # written atomically
    assert (root / ".gpuir").is_file()  # the directory is claimed as the memory `gpuir serve` creates


def test_verification(tmp_path):
    ks = KeyStore(tmp_path)
    ka, kb = ks.add("alice"), ks.add("bob")
    assert ks.tenant_for(ka) == "alice" and ks.tenant_for(kb) == "bob"
    assert tenant_of_key(ka) == "alice"
    assert ks.tenant_for(ka[:-1] + ("A" if ka[-1] != "A" else "B")) is None  # one character changed
    assert ks.tenant_for(kb.replace("gpuir.bob.", "gpuir.alice.")) is None  # tenant part forged
    assert ks.tenant_for("") is None and ks.tenant_for("gpuir.alice.short") is None
    assert parse_key("not a key") is None
    with pytest.raises(ValueError, match="tenant"):
        ks.add("bad/tenant")


def test_revoke_by_tenant_and_by_key_id_and_list(tmp_path, capsys):
    root = tmp_path / "mem"
    a1, a2, b1 = _add(root, "alice", capsys), _add(root, "alice", capsys), _add(root, "bob", capsys)
    assert cli.main(["serve-keys", str(root), "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["tenant"] for r in rows] == ["alice", "alice", "bob"]
    assert all(set(r) == {"tenant", "key_id", "created"} for r in rows)
    # by key id: only that key
    assert cli.main(["serve-keys", str(root), "revoke", rows[0]["key_id"]]) == 0
    capsys.readouterr()
    ks = KeyStore(root)
    assert ks.tenant_for(a1) is None and ks.tenant_for(a2) == "alice"
    # by tenant: all its keys
    assert cli.main(["serve-keys", str(root), "revoke", "alice"]) == 0
    capsys.readouterr()
    ks = KeyStore(root)
    assert ks.tenant_for(a2) is None and ks.tenant_for(b1) == "bob"
    # nothing matched: exit 2, the file is unchanged
    before = (root / KEYS_FILE).read_bytes()
    assert cli.main(["serve-keys", str(root), "revoke", "nobody"]) == 2
    assert "names no tenant" in capsys.readouterr().err
    assert (root / KEYS_FILE).read_bytes() == before


def test_a_running_keystore_sees_changes(tmp_path):
    served = KeyStore(tmp_path)
    other = KeyStore(tmp_path)  # as `gpuir serve-keys` in another process
    k = other.add("carol")
    assert served.tenant_for(k) == "carol"
    other.revoke("carol")
    assert served.tenant_for(k) is None


def test_bad_tenant_and_damaged_file_are_exit_2(tmp_path, capsys):
    assert cli.main(["serve-keys", str(tmp_path / "m"), "add", "no spaces"]) == 2
    assert "tenant" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()  # refused before anything is created
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / KEYS_FILE).write_text("{not json")
    assert cli.main(["serve-keys", str(tmp_path / "m"), "list"]) == 2
    assert "unreadable keys file" in capsys.readouterr().err


def test_every_option_has_help_and_a_visible_default(capsys):
    import argparse

    p = argparse.ArgumentParser(prog="gpuir")
    cli.add_parsers(p.add_subparsers())
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--help"])
    out = capsys.readouterr().out
    for opt, default in [("--host", "127.0.0.1"), ("--port", "8080"), ("--batch-window-ms", "2.0"),
                         ("--max-batch", "256"), ("--checkpoint-every", "10000"), ("--backend", "auto")]:
        assert opt in out and f"default: {default}" in " ".join(out.split()), opt


def test_import_gpuir_needs_no_service_packages():
    import subprocess
    import sys

    code = ("import sys, gpuir, gpuir.service, gpuir.service.cli; "
            "bad = [m for m in ('fastapi', 'uvicorn', 'httpx', 'prometheus_client') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_key_id_never_reads_as_an_option(tmp_path, monkeypatch, capsys):
    """A secret starting with "-" made a key id that `gpuir serve-keys DIR revoke KEY_ID` read as an option
    (exit 2; token_urlsafe gives one in 32 keys): such secrets are drawn again."""
    import secrets

    draws = iter(["-" + "A" * 42, "_" + "B" * 42, "C" * 43])
    monkeypatch.setattr(secrets, "token_urlsafe", lambda n=32: next(draws))
    key = KeyStore(tmp_path).add("alice")
    assert parse_key(key)[1] == "C" * 8
    assert cli.main(["serve-keys", str(tmp_path), "revoke", parse_key(key)[1]]) == 0
    assert KeyStore(tmp_path).tenant_for(key) is None
