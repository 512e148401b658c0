"""``createsuperuser`` without a way around the password validators (issue 19).

Django's command checks ``AUTH_PASSWORD_VALIDATORS`` only when it prompts, and then
offers "Bypass password validation and create user anyway?"; with ``--noinput`` it
takes ``DJANGO_SUPERUSER_PASSWORD`` unchecked. Production configures Django's four
validators, and a superuser can resolve effects, so here the password is checked
where the user is created, whichever way it was given: a refused one is one line
and exit code 1, and no user is created.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.management.commands import createsuperuser
from django.contrib.auth.password_validation import validate_password


class _CheckedManager:
    """The user manager, its ``create_superuser`` validating the password first."""

    def __init__(self, manager: Any) -> None:
        self._manager = manager

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def create_superuser(self, **fields: Any) -> Any:
        password = fields.get("password")
        if password is not None:
            model = get_user_model()
            # Django's ValidationError: the command turns it into one CommandError line.
            validate_password(
                password,
                model(
                    **{
                        name: fields.get(name)
                        for name in (model.USERNAME_FIELD, model.EMAIL_FIELD)
                        if isinstance(fields.get(name), str)
                    }
                ),
            )
        return self._manager.create_superuser(**fields)


class _CheckedUserModel:
    """The user model as the command uses it, with ``_CheckedManager`` as its manager."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def _default_manager(self) -> Any:
        model = self._model

        class _Manager:
            def db_manager(self, database: str) -> _CheckedManager:
                return _CheckedManager(model._default_manager.db_manager(database))

        return _Manager()


class Command(createsuperuser.Command):
    help = createsuperuser.Command.help + " The password must pass the validators."

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Stands in for the model class where the command reaches its manager.
        self.UserModel = _CheckedUserModel(self.UserModel)  # type: ignore[assignment]
