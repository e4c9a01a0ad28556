"""Periodic schedules: definitions and their ticks, where they are declared, their evaluation, operator actions and the overview."""
