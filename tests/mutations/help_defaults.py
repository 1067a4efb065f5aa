"""Mutations of --help texts, descriptions and each mode's defaults against its help."""

from .base import Mutation, P, T  # noqa: F401

MUTATIONS: list[Mutation] = []
