package hub

import "sync"

// workQueue is an unbounded FIFO that workers block on. It is bounded in
// practice by its users: a connection is queued at most once at a time.
type workQueue[T any] struct {
	mu     sync.Mutex
	cond   sync.Cond
	items  []T
	head   int
	closed bool
}

func (q *workQueue[T]) init() { q.cond.L = &q.mu }

func (q *workQueue[T]) push(v T) {
	q.mu.Lock()
	q.items = append(q.items, v)
	q.mu.Unlock()
	q.cond.Signal()
}

// wakeBatch is how many items pushAll hands each waiter it wakes. A writer
// pops until the queue is empty, so one woken writer serves a whole batch;
// waking one goroutine per item costs a scheduler round trip (and, with an
// idle core, a thread wake-up) each, the largest cost of a light load's
// deliveries, for writes of a few microseconds.
const wakeBatch = 8

// pushAll queues vs in order with one lock, and wakes one waiter per
// wakeBatch items.
func (q *workQueue[T]) pushAll(vs []T) {
	if len(vs) == 0 {
		return
	}
	q.mu.Lock()
	q.items = append(q.items, vs...)
	q.mu.Unlock()
	for range (len(vs) + wakeBatch - 1) / wakeBatch {
		q.cond.Signal() // cheap once no waiter is left
	}
}

// pushQuiet queues v and wakes a waiter only if the queue was empty: a
// waiter woken earlier has not popped yet and takes v with the rest, so
// items that arrive together cost one wake-up, not one each.
func (q *workQueue[T]) pushQuiet(v T) {
	q.mu.Lock()
	wasEmpty := q.head == len(q.items)
	q.items = append(q.items, v)
	q.mu.Unlock()
	if wasEmpty {
		q.cond.Signal()
	}
}

// popUpTo blocks until an item is queued or the queue is closed, then
// appends up to n items to dst, and wakes another waiter for any left.
func (q *workQueue[T]) popUpTo(dst []T, n int) ([]T, bool) {
	q.mu.Lock()
	for q.head == len(q.items) && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		q.mu.Unlock()
		return dst, false
	}
	take := min(n, len(q.items)-q.head)
	dst = append(dst, q.items[q.head:q.head+take]...)
	q.dropLocked(take)
	left := q.head < len(q.items)
	q.mu.Unlock()
	if left {
		q.cond.Signal()
	}
	return dst, true
}

// pop blocks until an item is queued or the queue is closed.
func (q *workQueue[T]) pop() (T, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.head == len(q.items) && !q.closed {
		q.cond.Wait()
	}
	var zero T
	if q.closed {
		return zero, false
	}
	v := q.items[q.head]
	q.dropLocked(1)
	return v, true
}

// dropLocked drops the n items at the head, taken, and lets go of the
// space before the head once it is most of the array.
func (q *workQueue[T]) dropLocked(n int) {
	clear(q.items[q.head : q.head+n])
	q.head += n
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 1024 && q.head*2 > len(q.items) {
		q.items, q.head = append(q.items[:0], q.items[q.head:]...), 0
	}
}

func (q *workQueue[T]) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

// dispatchQueue holds tasks waiting to be re-read. A task is queued once:
// notifications for a queued task raise its version instead, so a storm of
// changes to one task costs one read, and the bus's reading loop never
// waits.
type dispatchQueue struct {
	mu      sync.Mutex
	pending map[key]announced // per queued task
	q       workQueue[key]
}

// announced is what the notifications of a queued task said.
type announced struct {
	version int64 // the highest version
	heard   int64 // Unix ns the first of them was heard: the write answers it too
}

func (d *dispatchQueue) init() {
	d.pending = make(map[key]announced)
	d.q.init()
}

func (d *dispatchQueue) push(k key, version, heard int64) {
	d.mu.Lock()
	if a, ok := d.pending[k]; ok {
		d.pending[k] = announced{max(a.version, version), a.heard}
		d.mu.Unlock()
		return
	}
	d.pending[k] = announced{version, heard}
	d.mu.Unlock()
	d.q.pushQuiet(k)
}

// notice is a queued task and what its notifications announced.
type notice struct {
	key
	announced
}

// popBatch blocks until a task is queued or the queue is closed, then
// returns up to n queued tasks in batch, reusing its and keys' arrays:
// hints that arrived together are read together.
func (d *dispatchQueue) popBatch(batch []notice, keys []key, n int) ([]notice, []key, bool) {
	keys, ok := d.q.popUpTo(keys[:0], n)
	if !ok {
		return batch[:0], keys, false
	}
	batch = batch[:0]
	d.mu.Lock()
	for _, k := range keys {
		batch = append(batch, notice{k, d.pending[k]})
		delete(d.pending, k)
	}
	d.mu.Unlock()
	clear(keys)
	return batch, keys, true
}

func (d *dispatchQueue) close() { d.q.close() }
