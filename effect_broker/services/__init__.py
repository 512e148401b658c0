"""Use cases over the store and the domain core: submit, dispatch, reconcile, resolve."""
