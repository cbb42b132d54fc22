"""The process's peak resident memory while a block of code runs, sampled by a thread."""

import threading
import time

import psutil


class PeakRSS:
    """Context manager sampling this process's RSS every 20 ms; .peak in MiB."""

    def __enter__(self):
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        proc = psutil.Process()
        while not self._stop.is_set():
            self._take(proc)
            time.sleep(0.02)

    def _take(self, proc: psutil.Process) -> None:
        self.peak = max(self.peak, proc.memory_info().rss / 2**20)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self._take(psutil.Process())  # a block shorter than the thread's start-up got no sample: peak read 0
