"""`astrai tinker`: a service that speaks the Tinker training API.

The HTTP layer (sessions, futures, auth, the SDK's wire types) turns each request into a
call on an :class:`~astrai_core.tinker.engine_types.Engine`, which owns the base models,
the tenants' LoRA adapters and optimizers, and the sampler. The two meet only through the
plain types in :mod:`astrai_core.tinker.engine_types`.
"""
