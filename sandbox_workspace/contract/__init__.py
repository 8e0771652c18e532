"""The shared vocabulary every deployable stands on: the error contract, the id rules, the
custom resources' constants and their condition reasons.

Contract: modules here import nothing of ``sandbox_workspace`` outside this package (no
runtime, operator, API or store; tests/unit/test_dependency_direction.py), so the runtime,
the operator and the API can all use them without needing each other. This ``__init__``
re-exports nothing: import the module you mean (``contract.errors``, ``contract.ids`` …).
"""
