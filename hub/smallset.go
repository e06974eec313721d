package hub

// Most connections watch one task, or a few. A Go map's first allocation
// is a group of eight slots (about 150 bytes for a set of ids, 200 for a
// map of them, with its header), most of an idle connection's memory: so a
// connection's sets keep up to smallMax entries in a slice, found by
// scanning, and move to a map past that, for good.
const smallMax = 8

// idSet is a set of task or project ids. The zero value is empty.
type idSet struct {
	few  []string
	many map[string]struct{}
}

func (s *idSet) has(id string) bool {
	if s.many != nil {
		_, ok := s.many[id]
		return ok
	}
	for _, v := range s.few {
		if v == id {
			return true
		}
	}
	return false
}

func (s *idSet) len() int {
	if s.many != nil {
		return len(s.many)
	}
	return len(s.few)
}

// add adds id, which the set does not hold.
func (s *idSet) add(id string) {
	switch {
	case s.many != nil:
		s.many[id] = struct{}{}
	case len(s.few) < smallMax:
		s.few = append(s.few, id)
	default:
		s.many = make(map[string]struct{}, 2*smallMax)
		for _, v := range s.few {
			s.many[v] = struct{}{}
		}
		s.many[id] = struct{}{}
		s.few = nil
	}
}

// remove removes id and reports whether the set held it.
func (s *idSet) remove(id string) bool {
	if s.many != nil {
		_, ok := s.many[id]
		delete(s.many, id)
		return ok
	}
	for i, v := range s.few {
		if v == id {
			last := len(s.few) - 1
			s.few[i] = s.few[last]
			s.few[last] = ""
			s.few = s.few[:last]
			return true
		}
	}
	return false
}

// each calls f with every id, in no particular order.
func (s *idSet) each(f func(id string)) {
	if s.many != nil {
		for id := range s.many {
			f(id)
		}
		return
	}
	for _, id := range s.few {
		f(id)
	}
}

// ids returns every id, in no particular order.
func (s *idSet) ids() []string {
	out := make([]string, 0, s.len())
	s.each(func(id string) { out = append(out, id) })
	return out
}

// trackSet holds a connection's tracked entries by task id. The zero
// value is empty.
type trackSet struct {
	few  []*tracked
	many map[string]*tracked
}

// get returns the entry of task id, or nil.
func (s *trackSet) get(id string) *tracked {
	if s.many != nil {
		return s.many[id]
	}
	for _, t := range s.few {
		if t.id == id {
			return t
		}
	}
	return nil
}

func (s *trackSet) len() int {
	if s.many != nil {
		return len(s.many)
	}
	return len(s.few)
}

// put adds t, whose task has no entry.
func (s *trackSet) put(t *tracked) {
	switch {
	case s.many != nil:
		s.many[t.id] = t
	case len(s.few) < smallMax:
		s.few = append(s.few, t)
	default:
		s.many = make(map[string]*tracked, 2*smallMax)
		for _, v := range s.few {
			s.many[v.id] = v
		}
		s.many[t.id] = t
		s.few = nil
	}
}

// remove removes the entry of task id, if any.
func (s *trackSet) remove(id string) {
	if s.many != nil {
		delete(s.many, id)
		return
	}
	for i, t := range s.few {
		if t.id == id {
			last := len(s.few) - 1
			s.few[i] = s.few[last]
			s.few[last] = nil
			s.few = s.few[:last]
			return
		}
	}
}

// evictOne removes one entry keep does not protect and returns its task,
// if it found one. A map's is picked by its random iteration start; a
// slice is never full enough to need it (smallMax < maxTracked).
func (s *trackSet) evictOne(keep func(*tracked) bool) (string, bool) {
	if s.many != nil {
		for id, t := range s.many {
			if !keep(t) {
				delete(s.many, id)
				return id, true
			}
		}
		return "", false
	}
	for _, t := range s.few {
		if !keep(t) {
			s.remove(t.id)
			return t.id, true
		}
	}
	return "", false
}

// each calls f with every entry, in no particular order.
func (s *trackSet) each(f func(*tracked)) {
	if s.many != nil {
		for _, t := range s.many {
			f(t)
		}
		return
	}
	for _, t := range s.few {
		f(t)
	}
}
