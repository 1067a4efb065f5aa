"""Mutations of the model card of local data, the docs' serving example, repeatable documented numbers."""

from .base import Mutation, P, T  # noqa: F401

MUTATIONS: list[Mutation] = []
