"""Forms of the demo shop."""

from __future__ import annotations

from django import forms

from example_project.shop.models import Order, Product

PRODUCTS = ["Espresso beans, 1 kg", "Pour-over kettle", "Ceramic mug"]
# A webhook delivery id, matched whole (``fullmatch``, or ``\A...\Z``; ``$`` would let a trailing newline in).
DELIVERY_ID_PATTERN = r"[A-Za-z0-9_.:-]{1,100}"
DIGEST_USERS = ["alice", "bob", "carol"]


class OrderForm(forms.Form):
    """The "Place order" form; ``token`` is new on every render and names one placement."""

    token = forms.UUIDField(widget=forms.HiddenInput)
    product = forms.ChoiceField(choices=[(p, p) for p in PRODUCTS])
    quantity = forms.IntegerField(min_value=1, max_value=10, initial=1)


class WebhookDemoForm(forms.Form):
    """What the demo "provider" delivers to the webhook receiver, once or twice."""

    # Not stripped: " evt_1" is not the id "evt_1", so it is refused rather than taken for it.
    delivery_id = forms.RegexField(regex=rf"\A{DELIVERY_ID_PATTERN}\Z", max_length=100, strip=False)
    event_type = forms.ChoiceField(choices=[(t, t) for t in ("invoice.paid", "charge.refunded", "customer.updated")])
    times = forms.TypedChoiceField(choices=[(1, "once"), (2, "twice")], coerce=int, initial=2)


class InvoiceForm(forms.Form):
    amount = forms.DecimalField(min_value=1, max_value=10_000, decimal_places=2, initial="12.50")


class CaptureForm(forms.Form):
    """How the capture job should behave after the provider charged (demo only)."""

    simulate = forms.ChoiceField(
        choices=[
            ("", "Run normally"),
            ("fail", "Fail after the charge on the first attempt (the job is retried)"),
            ("hold", "Pause 60 s after the charge on the first attempt (time to kill -9 the worker)"),
        ],
        required=False,
        widget=forms.RadioSelect,
        initial="",
    )


class ProductForm(forms.ModelForm):
    class Meta:
        model = Product
        fields = ["description"]
        widgets = {"description": forms.Textarea(attrs={"rows": 2, "cols": 50})}


class DigestForm(forms.Form):
    user = forms.ChoiceField(choices=[(u, u) for u in DIGEST_USERS])


class RefundForm(forms.Form):
    """A refund request: one per order, so its idempotency key is built from the order."""

    order = forms.ModelChoiceField(queryset=Order.objects.all(), empty_label=None)
    amount = forms.IntegerField(min_value=1, max_value=500, initial=5, help_text="euros")
