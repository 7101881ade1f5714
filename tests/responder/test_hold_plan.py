"""The hold of a quarantined device-plugin card, as decisions (`responder.enforce.hold_plan`).

Aspects: a fill occupies every free GPU and keeps only the holders on the card; a card still in
use waits for its pods; a card no fill can get (its plugin excludes it) is tried again only
after the refill interval; holders refused or finished are made again; a kubelet that reports no
devices leaves the card counted out; MIG partitions and time-sliced replicas are held unit by
unit; and, as a property over a node whose kubelet picks devices at random, the fill converges
on holding exactly the card's free units and nothing else.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from responder.enforce.hold_plan import Card, Holder, HoldInput, HoldState, card_units, plan, plugin_word

CARD = Card("GPU-bad")


def holder(name: str, *devices: str, phase: str = "Running", age: float = 5.0) -> Holder:
    return Holder(name, phase, tuple(devices), age)


def test_a_fill_occupies_every_free_gpu_of_the_node() -> None:
    decided = plan(HoldInput(CARD, holders=(), busy=(), free=3))
    assert decided.state is HoldState.FILLING
    assert decided.create == 3 and decided.delete == ()


def test_while_holders_wait_for_their_devices_nothing_more_is_made() -> None:
    waiting = (holder("h1", phase="Pending", age=2.0), holder("h2", "GPU-a"))
    decided = plan(HoldInput(CARD, holders=waiting, busy=(), free=0))
    assert decided.state is HoldState.FILLING
    assert decided.create == 0 and decided.delete == ()


def test_a_complete_fill_keeps_the_holder_on_the_card_and_deletes_the_others() -> None:
    holders = (holder("h1", "GPU-a"), holder("h2", "GPU-bad"), holder("h3", "GPU-c"))
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=0))
    assert decided.state is HoldState.HELD
    assert set(decided.delete) == {"h1", "h3"}
    assert decided.keep == (("h2", ("GPU-bad",)),)
    assert decided.units == 1


def test_a_fill_goes_on_when_a_gpu_freed_meanwhile() -> None:
    holders = (holder("h1", "GPU-a"), holder("h2", "GPU-c"))
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=1))
    assert decided.state is HoldState.FILLING
    assert decided.create == 1 and decided.delete == ()


def test_a_held_card_makes_no_more_holders_though_the_node_has_free_gpus() -> None:
    decided = plan(HoldInput(CARD, holders=(holder("h2", "GPU-bad"),), busy=(), free=5))
    assert decided.state is HoldState.HELD
    assert decided.create == 0 and decided.delete == ()


def test_a_card_in_use_waits_for_its_pods_and_holds_nothing_else() -> None:
    holders = (holder("h1", "GPU-a"), holder("h2", "GPU-c"))
    decided = plan(HoldInput(CARD, holders=holders, busy=("GPU-bad",), free=0))
    assert decided.state is HoldState.CARD_BUSY
    assert set(decided.delete) == {"h1", "h2"}
    # Next pass: the deleted holders freed their GPUs; nothing is made while the card is in use.
    again = plan(HoldInput(CARD, holders=(), busy=("GPU-bad",), free=2))
    assert again.state is HoldState.CARD_BUSY and again.create == 0


def test_when_the_pod_on_the_card_has_left_the_card_is_filled() -> None:
    decided = plan(HoldInput(CARD, holders=(), busy=(), free=3, previous=HoldState.CARD_BUSY))
    assert decided.state is HoldState.FILLING and decided.create == 3


def test_a_card_its_plugin_excludes_is_tried_again_only_after_the_refill_interval() -> None:
    holders = (holder("h1", "GPU-a"), holder("h2", "GPU-c"))
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=0))
    assert decided.state is HoldState.NOT_ALLOCATABLE
    assert set(decided.delete) == {"h1", "h2"}
    soon = plan(
        HoldInput(CARD, (), (), free=2, previous=HoldState.NOT_ALLOCATABLE, previous_age_seconds=59.0)
    )
    assert soon.state is HoldState.NOT_ALLOCATABLE and soon.create == 0
    later = plan(
        HoldInput(CARD, (), (), free=2, previous=HoldState.NOT_ALLOCATABLE, previous_age_seconds=60.0)
    )
    assert later.state is HoldState.FILLING and later.create == 2
    # The plugin restarted and forgot its Unhealthy: the node's allocatable rose, a fill at once.
    back = plan(
        HoldInput(
            CARD, (), (), free=3, previous=HoldState.NOT_ALLOCATABLE, previous_age_seconds=1.0,
            allocatable_rose=True,
        )
    )  # fmt: skip
    assert back.state is HoldState.FILLING and back.create == 3


def test_refused_and_finished_holders_are_deleted_and_the_card_filled_again() -> None:
    holders = (holder("h1", phase="Failed"), holder("h2", "GPU-a", phase="Succeeded"))
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=1))
    assert set(decided.delete) == {"h1", "h2"}
    assert decided.state is HoldState.FILLING and decided.create == 1


def test_a_holder_deleted_by_someone_is_made_again() -> None:
    decided = plan(HoldInput(CARD, holders=(), busy=(), free=1, previous=HoldState.HELD))
    assert decided.state is HoldState.FILLING and decided.create == 1


def test_a_kubelet_that_reports_no_devices_leaves_the_card_counted_out() -> None:
    holders = (holder("h1", age=61.0), holder("h2", age=61.0))
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=0, fill_timeout_seconds=60.0))
    assert decided.state is HoldState.UNREADABLE
    assert set(decided.delete) == {"h1", "h2"}


def test_an_unreadable_allocation_names_every_source_tried() -> None:
    holders = (holder("h1", age=61.0),)
    tried = ("the kubelet's report", "the exporter's series (no answer: refused)")
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=0, device_sources=tried))
    assert decided.state is HoldState.UNREADABLE
    assert "by the kubelet's report; nor by the exporter's series (no answer: refused)" in decided.message


def test_a_holder_the_kubelet_never_started_is_made_again() -> None:
    holders = (holder("h1", phase="Pending", age=61.0),)
    decided = plan(HoldInput(CARD, holders=holders, busy=(), free=0, fill_timeout_seconds=60.0))
    assert decided.state is HoldState.FILLING and decided.delete == ("h1",)


def test_a_mig_card_is_held_partition_by_partition() -> None:
    card = Card("GPU-bad", partitions=("MIG-1", "MIG-2"))
    half = plan(HoldInput(card, holders=(holder("h1", "MIG-1"), holder("h2", "GPU-a")), busy=(), free=1))
    assert half.state is HoldState.FILLING and half.create == 1
    whole = plan(
        HoldInput(
            card,
            holders=(holder("h1", "MIG-1"), holder("h2", "GPU-a"), holder("h3", "MIG-2")),
            busy=(),
            free=0,
        )
    )
    assert whole.state is HoldState.HELD and whole.delete == ("h2",)
    assert dict(whole.keep) == {"h1": ("MIG-1",), "h3": ("MIG-2",)}


def test_time_sliced_replicas_are_held_one_by_one_as_many_as_a_fill_saw() -> None:
    card = Card("GPU-bad", replicas=0)
    holders = (
        holder("h1", "GPU-bad::0"),
        holder("h2", "GPU-bad::2"),
        holder("h3", "GPU-a::1"),
    )
    decided = plan(HoldInput(card, holders=holders, busy=("GPU-bad::1",), free=0))
    # Every free replica of the node got a holder: the card's are those held and the one in use.
    assert decided.state is HoldState.CARD_BUSY
    assert decided.units == 3 and decided.delete == ("h3",)
    # The busy replica's pod left: the card is filled again for it.
    again = plan(HoldInput(card, holders=holders[:2], busy=(), free=2))
    assert again.state is HoldState.FILLING and again.create == 2


def test_a_card_s_units() -> None:
    assert card_units(Card("GPU-x"), ()) == 1
    assert card_units(Card("GPU-x", partitions=("a", "b", "c")), ()) == 3
    assert card_units(Card("GPU-x", replicas=4), ()) == 4
    assert card_units(Card("GPU-x"), ("GPU-x::5",)) == 6


# ---------------------------------------------------------------------------- the property


@settings(max_examples=200, deadline=None)
@given(
    gpus=st.integers(min_value=1, max_value=8),
    replicas=st.integers(min_value=1, max_value=3),
    used=st.data(),
    excluded=st.booleans(),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_a_fill_converges_on_holding_exactly_the_card_s_free_units(
    gpus: int, replicas: int, used: st.DataObject, excluded: bool, seed: int
) -> None:
    """A node of `gpus` cards (`replicas` units each) whose kubelet hands each new pod a random
    free unit; card 0 is quarantined (and, if `excluded`, reported Unhealthy by its plugin, so
    the kubelet gives it to nobody); some units run workload pods. Passes of the plan, each
    applied, end with the card's free units held, no other unit held, and the state saying so."""
    rng = random.Random(seed)
    units = [f"GPU-{g}" if replicas == 1 else f"GPU-{g}::{r}" for g in range(gpus) for r in range(replicas)]
    card = Card("GPU-0", replicas=replicas if replicas > 1 else 0)
    busy_units = set(used.draw(st.sets(st.sampled_from(units))))
    allocatable = {u for u in units if not (excluded and card.owns(u))}
    holders: dict[str, str | None] = {}  # name -> unit (None: not yet started)
    counter = 0
    state = None
    for _ in range(12):
        # The kubelet starts pending holders on random free units (or refuses them: Failed).
        for name, unit in list(holders.items()):
            if unit is None:
                free = sorted(allocatable - busy_units - {u for u in holders.values() if u})
                holders[name] = rng.choice(free) if free else "refused"
        requested = len(busy_units & allocatable) + sum(1 for u in holders.values() if u != "refused")
        views = tuple(
            holder(name, phase="Failed") if unit == "refused" else holder(name, *([unit] if unit else []))
            for name, unit in holders.items()
        )
        decided = plan(
            HoldInput(
                card,
                holders=views,
                busy=tuple(u for u in busy_units if card.owns(u)),
                free=max(0, len(allocatable) - requested),
                previous=state,
                previous_age_seconds=0.0,
            )
        )
        state = decided.state
        for name in decided.delete:
            holders.pop(name)
        for _ in range(decided.create):
            counter += 1
            holders[f"h{counter}"] = None
        if not decided.create and not decided.delete and all(u is not None for u in holders.values()):
            break
    held = {u for u in holders.values() if u and u != "refused"}
    card_free = {u for u in allocatable if card.owns(u)} - busy_units
    assert held == card_free
    if any(card.owns(u) for u in busy_units):
        assert state is HoldState.CARD_BUSY
    elif card_free:
        assert state is HoldState.HELD
    else:
        assert state is HoldState.NOT_ALLOCATABLE


def test_a_pod_not_yet_told_its_devices_is_waited_for_never_taken_for_an_excluded_card() -> None:
    # Another record's fill took every free GPU; its holders have no devices yet.
    decided = plan(HoldInput(CARD, holders=(), busy=(), free=0, unknown=3))
    assert decided.state is HoldState.FILLING and decided.create == 0
    assert plan(HoldInput(CARD, holders=(), busy=(), free=0)).state is HoldState.NOT_ALLOCATABLE


def test_for_a_check_the_hold_steps_aside_once_every_other_free_gpu_is_held() -> None:
    held = holder("h0", "GPU-bad")
    # The node's 3 other free GPUs are held first, the card's holder kept meanwhile.
    first = plan(HoldInput(CARD, holders=(held,), busy=(), free=3, aside=True))
    assert first.state is HoldState.FILLING and first.create == 3 and first.delete == ()
    others = (holder("h1", "GPU-a"), holder("h2", "GPU-b"), holder("h3", "GPU-c"))
    second = plan(HoldInput(CARD, holders=(held, *others), busy=(), free=0, aside=True))
    assert second.state is HoldState.FILLING and second.delete == ("h0",)
    # The card is the one free GPU: a check's one-GPU request can only be given the card.
    ready = plan(HoldInput(CARD, holders=others, busy=(), free=1, aside=True))
    assert ready.state is HoldState.ASIDE and ready.create == 0 and ready.delete == ()
    # A pod elsewhere ended: that GPU is held before the check may start (every free one is
    # filled: the kubelet, not we, picks which unit each holder gets).
    freed = plan(HoldInput(CARD, holders=others, busy=(), free=2, aside=True))
    assert freed.state is HoldState.FILLING and freed.create == 2
    # The check runs on the card: still stepped aside; afterwards the hold comes back with a fill.
    checking = plan(HoldInput(CARD, holders=others, busy=(), free=0, aside=True, checking=("GPU-bad",)))
    assert checking.state is HoldState.ASIDE
    back = plan(HoldInput(CARD, holders=others, busy=(), free=1))
    assert back.state is HoldState.FILLING and back.create == 1


def test_no_check_while_a_workload_pod_is_on_the_card() -> None:
    decided = plan(HoldInput(CARD, holders=(), busy=("GPU-bad",), free=2, aside=True))
    assert decided.state is HoldState.CARD_BUSY and decided.create == 0


def test_a_card_its_plugin_reports_unhealthy_is_not_filled_for_while_the_node_is_short() -> None:
    # The pod that was on it said Unhealthy; it has left; the node's allocatable is one short.
    excluded = plan(HoldInput(CARD, holders=(), busy=(), free=2, plugin_excludes=True, excluded=1))
    assert excluded.state is HoldState.NOT_ALLOCATABLE and excluded.create == 0
    # Every device allocatable again (the plugin restarted and forgot): filled at once.
    back = plan(HoldInput(CARD, holders=(), busy=(), free=3, plugin_excludes=True, excluded=0))
    assert back.state is HoldState.FILLING and back.create == 3


def test_a_time_sliced_card_steps_aside_as_many_replicas_as_it_was_held_with() -> None:
    card = Card("GPU-bad")  # no replicas label on the node
    others = (holder("h1", "GPU-a::0"), holder("h2", "GPU-a::1"))
    # Its two replicas' holders are gone: two units free, both the card's.
    ready = plan(HoldInput(card, holders=others, busy=(), free=2, aside=True, known_units=2))
    assert ready.state is HoldState.ASIDE and ready.create == 0
    # Without knowing it had two, one of the free units would be taken for another card's.
    guess = plan(HoldInput(card, holders=others, busy=(), free=2, aside=True))
    assert guess.state is HoldState.FILLING


def test_on_the_ramp_the_card_takes_the_opted_in_work_then_everyone_is_let_back() -> None:
    others = (holder("h1", "GPU-a"), holder("h2", "GPU-b"))
    # The ramp's first opted-in pod can only be given the card: the node's other GPUs are held.
    waiting = plan(HoldInput(CARD, holders=others, busy=(), free=1, aside=True, ramp=True))
    assert waiting.state is HoldState.ASIDE and waiting.delete == ()
    # It is on the card: every holder goes.
    taken = plan(HoldInput(CARD, holders=others, busy=("GPU-bad",), free=0, aside=True, ramp=True))
    assert taken.state is HoldState.RAMPING and set(taken.delete) == {"h1", "h2"}


def test_the_plugin_s_unhealthy_is_believed_only_while_the_node_s_excluded_count_stands() -> None:
    # The flapping card's pod said Unhealthy while its plugin excluded it (one GPU short).
    seen = plugin_word(None, reported_unhealthy=True, excluded=1)
    assert seen == 1
    # The pod has left; the node is still one short: the card is believed excluded.
    assert plugin_word(seen, reported_unhealthy=False, excluded=1) == 1
    # The plugin let it back (no GPU short): the word is void...
    assert plugin_word(seen, reported_unhealthy=False, excluded=0) is None
    # ... and stays void when another card of the node is excluded later, one short again: a
    # fill must find out which card that is (CI saw a replacement given the flapping card when
    # this was taken for the card's own exclusion).
    assert plugin_word(None, reported_unhealthy=False, excluded=1) is None
    after = plan(HoldInput(CARD, holders=(), busy=(), free=3, plugin_excludes=False, excluded=1))
    assert after.state is HoldState.FILLING and after.create == 3


def test_part_of_a_time_sliced_card_held_is_not_held_while_a_pod_may_have_the_rest() -> None:
    # Two replicas (the node's label); a fill completed with one holder on the card and one on
    # another card, while a pod bound meanwhile is not yet told its devices (CI's churn run on the
    # real control plane: Held with one of two replicas, and the pod started on the other).
    card = Card("GPU-bad", replicas=2)
    holders = (holder("h1", "GPU-bad::0"), holder("h2", "GPU-a::0"))
    waiting = plan(HoldInput(card, holders=holders, busy=(), free=0, unknown=1))
    assert waiting.state is HoldState.FILLING and waiting.state.pending
    assert waiting.delete == ("h2",) and waiting.units == 2
    # Told: the pod is on the other replica (busy, to be moved) ...
    on_card = plan(HoldInput(card, holders=holders[:1], busy=("GPU-bad::1",), free=0))
    assert on_card.state is HoldState.CARD_BUSY
    # ... or elsewhere, and the replica is free: filled.
    elsewhere = plan(HoldInput(card, holders=holders[:1], busy=(), free=1))
    assert elsewhere.state is HoldState.FILLING and elsewhere.create == 1
    # With nothing unknown a complete fill says what the card has: held.
    assert plan(HoldInput(card, holders=holders, busy=(), free=0)).state is HoldState.HELD


def test_a_fill_that_got_none_of_the_card_while_the_plugin_let_a_device_back_fills_again() -> None:
    """The plugin let the card back while the fill ran (it recovered; seen in CI's release-request
    scenario): the holders got other GPUs before the card was allocatable, so the fill proves
    nothing about it. Concluding NotAllocatable at the new count left the card to the next pod."""
    others = (holder("h1", "GPU-a"), holder("h2", "GPU-c"))
    stale = plan(HoldInput(CARD, others, (), free=0, allocatable=3, fill_allocatable=2))
    assert stale.state is HoldState.FILLING and set(stale.delete) == {"h1", "h2"}
    assert "from 2 to 3" in stale.message
    # The same fill at an unchanged count: the plugin does exclude the card.
    steady = plan(HoldInput(CARD, others, (), free=0, allocatable=2, fill_allocatable=2))
    assert steady.state is HoldState.NOT_ALLOCATABLE
    # Its holders gone, the next pass judges the node as it is: a GPU free is filled for.
    after = plan(HoldInput(CARD, (), (), free=1, allocatable=3, fill_allocatable=2))
    assert after.state is HoldState.FILLING and after.create == 1


def test_a_fill_short_of_the_node_s_healthy_gpus_proves_nothing_and_keeps_its_holders() -> None:
    """A pod stays on another card its plugin calls Unhealthy: its request still counts against
    allocatable, so the kubelet admitted one holder fewer than the node has Healthy free GPUs,
    and the card may be the one left (CI's release-request at 20x: the card had recovered, the
    fill got the other two, `excluded@3` let the next pod be handed the card)."""
    others = (holder("h1", "GPU-a"), holder("h2", "GPU-c"))
    short = plan(HoldInput(CARD, others, (), free=0, allocatable=3, fill_allocatable=3, stranded=1))
    assert short.state is HoldState.FILLING and short.state.pending
    assert short.delete == () and short.create == 0, "the holders stay: the node takes no new pod"
    assert "1 excluded GPU unit(s)" in short.message
    # The pod on the Unhealthy card left: its unit is free, and the fill goes on to the card.
    left = plan(HoldInput(CARD, others, (), free=1, allocatable=3, fill_allocatable=3))
    assert left.state is HoldState.FILLING and left.create == 1 and left.delete == ()
    held = plan(HoldInput(CARD, (*others, holder("h3", "GPU-bad")), (), free=0, stranded=1))
    assert held.state is HoldState.HELD and set(held.delete) == {"h1", "h2"}
    # No pod on an excluded device: the same fill does show the plugin excludes the card.
    steady = plan(HoldInput(CARD, others, (), free=0, allocatable=3, fill_allocatable=3))
    assert steady.state is HoldState.NOT_ALLOCATABLE and set(steady.delete) == {"h1", "h2"}
    # Nor is the card judged excluded with no fill at all while the node is full that way.
    full = plan(HoldInput(CARD, (), (), free=0, allocatable=3, stranded=1))
    assert full.state is HoldState.FILLING and full.create == 0
    # An excluded GPU besides the pod's, which no pod reports: taken to be the card (a card held
    # and then called Unhealthy does not keep every other hold of its node pending).
    unnamed = plan(HoldInput(CARD, others, (), free=0, stranded=1, excluded=2, excluded_unreported=1))
    assert unnamed.state is HoldState.NOT_ALLOCATABLE and set(unnamed.delete) == {"h1", "h2"}
