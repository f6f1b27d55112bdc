// A table of a stats struct's figures: each uint64_t member with the name of the field it is
// reported as in the API's Stats message ("gpu.hits": the hits of Stats.gpu). server/stats.cc fills
// the message from the table, and sums tiers with it, so a new figure is a member, its line in
// the table (a static_assert next to the table checks that none is missing) and its field in
// proto/tierd/v1/tierd.proto, where its help, metric and tierctl line are declared.
#ifndef TIERD_COMMON_FIGURES_H_
#define TIERD_COMMON_FIGURES_H_

#include <cstdint>

namespace tierd {

template <typename Stats>
struct Figure {
  const char* reported_as;  // a field path of tierd.v1.Stats, dot-separated
  uint64_t Stats::*value;
};

// Adds every figure of `from` to `to`.
template <typename Stats, size_t N>
void AddFigures(const Figure<Stats> (&figures)[N], const Stats& from, Stats& to) {
  for (const Figure<Stats>& figure : figures) to.*figure.value += from.*figure.value;
}

}  // namespace tierd

#endif  // TIERD_COMMON_FIGURES_H_
