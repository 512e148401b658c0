"""``effect-broker keys list | rotate | reencrypt``: master-key rotation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandParser

from effect_broker.domain.errors import ConfigurationError
from effect_broker.domain.master_keys import MasterKeys
from effect_broker.management.base import BrokerCommand
from effect_broker.services import key_rotation


def _keys() -> MasterKeys:
    keys: MasterKeys | None = settings.EFFECT_BROKER_MASTER_KEYS
    if keys is None:
        raise ConfigurationError("no master key is configured (EFFECT_BROKER_MASTER_KEY)")
    return keys


class Command(BrokerCommand):
    help = (
        "Master keys: 'list' shows each key id and how many stored payloads it "
        "encrypted; 'rotate' appends a new current key to the key file; 'reencrypt' "
        "moves every stored payload onto the current key."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="key ids, which is current, payloads each")
        listing.add_argument("--json", action="store_true", help="machine-readable")
        sub.add_parser(
            "rotate",
            help="append a new current key to the key file (then restart the processes "
            "and run 'keys reencrypt')",
        )
        again = sub.add_parser(
            "reencrypt", help="re-encrypt stored payloads under the current key"
        )
        again.add_argument(
            "--batch", type=int, default=500, help="rows per transaction (500)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, "_" + options["action"])(options)

    def _list(self, options: dict[str, Any]) -> None:
        keys = _keys()
        used = {u.key_id: u for u in key_rotation.usage()}
        rows: list[dict[str, Any]] = []
        for index, (key_id, _) in enumerate(keys.entries):
            u = used.pop(key_id, None)
            roles: list[str] = []
            if index == 0:
                roles.append("hashing root")
            if key_id == keys.current_id:
                roles.append("current")
            rows.append(
                {
                    "key_id": key_id,
                    "roles": roles,
                    "arguments": u.arguments if u else 0,
                    "results": u.results if u else 0,
                }
            )
        if options["json"]:
            self.stdout.write(json.dumps({"keys": rows, "missing": sorted(used)}))
        else:
            self.stdout.write(f"{'KEY':6} {'ARGUMENTS':>10} {'RESULTS':>10}  ROLE")
            for row in rows:
                self.stdout.write(
                    f"{row['key_id']:6} {row['arguments']:>10} {row['results']:>10}  "
                    + ", ".join(row["roles"])
                )
        if used:
            # Ciphertexts under a key this process does not have: they cannot be read.
            raise ConfigurationError(
                "stored payloads use key ids missing from the keyring: "
                + ", ".join(sorted(used))
            )

    def _rotate(self, options: dict[str, Any]) -> None:
        path = settings.EFFECT_BROKER_MASTER_KEY_PATH
        if path is None:
            raise ConfigurationError(
                "the master key comes from EFFECT_BROKER_MASTER_KEY, which this command "
                "cannot change: put it in a file named by EFFECT_BROKER_MASTER_KEY_FILE "
                "and rotate that"
            )
        keys = key_rotation.rotate_key_file(Path(path))
        self.stdout.write(f"new current key {keys.current_id} written to {path}")
        self.stdout.write(
            "next: restart the API and the workers so they encrypt with it, then run "
            "'effect-broker keys reencrypt'"
        )

    def _reencrypt(self, options: dict[str, Any]) -> None:
        if options["batch"] < 1:
            raise ConfigurationError("--batch must be at least 1")

        def progress(done: key_rotation.Reencrypted) -> None:
            self.stdout.write(
                f"  re-encrypted {done.arguments} arguments, {done.results} results"
            )
            self.stdout.flush()

        done = key_rotation.reencrypt(batch=options["batch"], progress=progress)
        self.stdout.write(
            f"done: {done.arguments} arguments and {done.results} results now under "
            f"key {_keys().current_id}"
        )
