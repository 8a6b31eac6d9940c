// Where the tests find the checkout and the built `blutrain`. The paths are
// compiled into one translation unit (paths.cpp), not into every test, so a
// test's object file does not depend on where the checkout lies and ccache
// shares it between clones.
#pragma once

#include <string>

namespace bt::test {

/// The repository root the tests were configured from.
const std::string& source_dir();
/// The `blutrain` executable of this build.
const std::string& blutrain_exe();

}  // namespace bt::test
