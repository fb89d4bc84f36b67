"""SIGTERM / Ctrl-C on a long command-line run: recorded, never raised, so the run stops after its step with a
checkpoint (train-agent and train-aha)."""
import argparse
import os
import signal

import pytest


@pytest.fixture()
def restore_handlers():
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


def test_a_signal_is_recorded_and_the_process_goes_on(restore_handlers):
    from explainers.stopping import stop_on_signals

    cancelled = stop_on_signals()
    assert not cancelled()
    os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread before kill returns
    assert cancelled()


def test_train_aha_stopped_by_a_signal_says_how_to_continue(restore_handlers, monkeypatch, capsys):
    """cmd_train_aha hands the loop a `cancelled` that reads the signals and, when the loop stops on it, says the
    same command continues (exit 0, no export summary)."""
    from explainers.aha_training import cli

    def fake_train(**options):
        assert not options["cancelled"]()
        os.kill(os.getpid(), signal.SIGTERM)
        assert options["cancelled"]()
        return {"cancelled": True, "step": 7, "total_steps": 100}

    monkeypatch.setattr(cli, "train_aha", fake_train)

    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    cli.add_train_aha_parser(commands)
    args = parser.parse_args(["train-aha", "--model", "bloodmnist-cnn", "--data", "cells"])
    assert cli.cmd_train_aha(args) == 0
    assert "stopped at step 7 of 100" in capsys.readouterr().err
