"""Run the provider emulator: ``python -m semframe.testing.emulator --port 8765``."""

from __future__ import annotations

import argparse
import sys

from semframe.testing.emulator.server import Latency, ProviderEmulator


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; prints the base URLs first."""
    parser = argparse.ArgumentParser(
        prog="python -m semframe.testing.emulator", description=__doc__
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface (default loopback)")
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free one)")
    parser.add_argument(
        "--latency",
        type=float,
        default=None,
        help="fixed seconds per request (default: each provider's typical time; 0: instant)",
    )
    parser.add_argument(
        "--per-token", type=float, default=None, help="seconds per output token (default 0)"
    )
    parser.add_argument("--batch-delay", type=float, default=0.0, help="seconds before batches end")
    args = parser.parse_args(argv)
    emu = ProviderEmulator(
        host=args.host,
        port=args.port,
        latency=None
        if args.latency is None and args.per_token is None
        else Latency(args.latency or 0.0, args.per_token or 0.0),
        batch_delay_s=args.batch_delay,
    )
    emu.start()
    sys.stdout.write(
        f"OpenAI base_url:    {emu.openai_url}\nAnthropic base_url: {emu.anthropic_url}\n"
        f"Gemini base_url:    {emu.gemini_url}\n"
    )
    sys.stdout.flush()
    try:
        emu.wait()
    except KeyboardInterrupt:
        pass
    finally:
        emu.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
