class AsyncLock: pass
class AsyncLockManager: pass
