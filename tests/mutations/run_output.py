"""Mutations of shared flags in every script, what a run prints, interruptions and offline messages."""

from .base import Mutation, P, T  # noqa: F401

MUTATIONS: list[Mutation] = []
