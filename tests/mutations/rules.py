"""Mutations of the enumerating rules: advice taken, recorded settings changed on a rerun, label-free paths."""

from .base import Mutation, P, T  # noqa: F401

MUTATIONS: list[Mutation] = []
