import asyncio, threading, time, sys
import pytest

@pytest.fixture(autouse=True)
def _watchdog():
    loop_holder = {}
    stop = threading.Event()
    def run():
        if stop.wait(25): return
        for loop in list(loop_holder.values()):
            def dump():
                for t in asyncio.all_tasks(loop):
                    print("TASK", t, file=sys.stderr); t.print_stack(limit=10, file=sys.stderr)
            loop.call_soon_threadsafe(dump)
    th = threading.Thread(target=run, daemon=True); th.start()
    orig = asyncio.BaseEventLoop.run_forever
    def rf(self):
        loop_holder[id(self)] = self
        return orig(self)
    asyncio.BaseEventLoop.run_forever = rf
    yield
    asyncio.BaseEventLoop.run_forever = orig
    stop.set()
