"""Forms of the demo shop."""

from __future__ import annotations

from django import forms

PRODUCTS = ["Espresso beans, 1 kg", "Pour-over kettle", "Ceramic mug"]


class OrderForm(forms.Form):
    """The "Place order" form; ``token`` is new on every render and names one placement."""

    token = forms.UUIDField(widget=forms.HiddenInput)
    product = forms.ChoiceField(choices=[(p, p) for p in PRODUCTS])
    quantity = forms.IntegerField(min_value=1, max_value=10, initial=1)
